"""`SpecialStream`: the append-only stream of evicted frames' special tokens, packed into pages.

Token t lives in page `pages[t // P]` at slot `t % P`; only the last used page is partial. The
pages come in chunks of `chunk_pages` consecutive ids; a cache of one stream adds them at the end
of its pools (so they are consecutive), a pool shared by several streams hands each stream the
chunks it grows into wherever they lie. Bookkeeping only: the cache grows the pools when
`pages_to_grow()` says so and hands the new ids over with `add_pages()`.
"""

from __future__ import annotations

from .errors import SpecialStreamFull


class SpecialStream:
    """Counts packed special tokens; pages come in chunks of `chunk_pages`."""

    def __init__(self, tokens_per_page: int, first_page: int, chunk_pages: int,
                 max_tokens: int | None) -> None:
        self.tokens_per_page = tokens_per_page
        self.chunk_pages = chunk_pages
        self.max_tokens = max_tokens
        self.pages = list(range(first_page, first_page + chunk_pages))   # allocated in every layer's pool
        self.num_tokens = 0

    @property
    def num_pages(self) -> int:
        return len(self.pages)

    @property
    def used_pages(self) -> int:
        return -(-self.num_tokens // self.tokens_per_page)

    @property
    def last_page_len(self) -> int:
        """Tokens in the last used page (P when none is used or it is full)."""
        rest = self.num_tokens % self.tokens_per_page
        return rest if rest else self.tokens_per_page

    def visible_pages(self) -> list[int]:
        return self.pages[:self.used_pages]

    def check_room(self, count: int) -> None:
        """Raise `SpecialStreamFull` if `count` more tokens would pass the cap."""
        if self.max_tokens is not None and self.num_tokens + count > self.max_tokens:
            raise SpecialStreamFull(
                f"the special stream holds {self.num_tokens} of max_special_tokens="
                f"{self.max_tokens} tokens and this step would add {count}; raise "
                "CacheSpec.max_special_tokens (None = unbounded), use camera_only, or reset()")

    def pages_to_grow(self, count: int) -> int:
        """Pages (whole chunks) to add before `count` more tokens fit; 0 if they fit."""
        needed = -(-(self.num_tokens + count) // self.tokens_per_page) - self.num_pages
        if needed <= 0:
            return 0
        return -(-needed // self.chunk_pages) * self.chunk_pages

    def add_pages(self, pages: list[int]) -> None:
        """Pages the cache grew for this stream (after `pages_to_grow`), in order."""
        self.pages.extend(pages)

    def append(self, count: int) -> list[tuple[int, int]]:
        """Claim `count` tokens; returns their (page, slot) in order. Room must exist."""
        start = self.num_tokens
        self.num_tokens += count
        assert self.used_pages <= self.num_pages, "special stream appended past its pages"
        per_page = self.tokens_per_page
        return [(self.pages[t // per_page], t % per_page) for t in range(start, start + count)]

    def truncate(self, count: int) -> None:
        """Drop the newest `count` tokens (rollback of a step whose evictions were pending)."""
        assert 0 <= count <= self.num_tokens, "truncating more special tokens than stored"
        self.num_tokens -= count
