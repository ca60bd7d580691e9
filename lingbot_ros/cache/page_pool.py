"""`PagePool`: the free list of frame pages. Mechanism only; the streams decide what to free."""

from __future__ import annotations

from .errors import CacheExhausted


class PagePool:
    """Hands out page ids `first_page .. first_page + num_pages - 1` and takes them back (a
    stream's share of a pool that several streams use starts past page 0).

    Freed pages are reused first (LIFO), so a steady stream touches few distinct pages.
    """

    def __init__(self, num_pages: int, first_page: int = 0) -> None:
        self.num_pages = num_pages
        self.first_page = first_page
        self._free: list[int] = []
        self._is_free: list[bool] = []
        self.reset()

    def reset(self) -> None:
        """Every page free; the lowest id is handed out first."""
        self._free = list(range(self.first_page + self.num_pages - 1, self.first_page - 1, -1))
        self._is_free = [True] * self.num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_pages(self) -> list[int]:
        """The free page ids (a copy), for checks and diagnostics."""
        return list(self._free)

    def allocate(self, count: int) -> list[int]:
        """Take `count` pages. Raises `CacheExhausted` (nothing taken) if fewer are free."""
        if count > len(self._free):
            raise CacheExhausted(
                f"need {count} free pages but only {len(self._free)} of {self.num_pages} are free; "
                "call flush() to recycle pending evictions or raise CacheSpec.deferred_capacity")
        pages = [self._free.pop() for _ in range(count)]
        for page in pages:
            assert self._is_free[page - self.first_page], f"page {page} handed out twice"
            self._is_free[page - self.first_page] = False
        return pages

    def free(self, pages: list[int]) -> None:
        """Return pages; the last one given is the first reused."""
        for page in pages:
            assert not self._is_free[page - self.first_page], f"page {page} freed twice"
            self._is_free[page - self.first_page] = True
            self._free.append(page)
