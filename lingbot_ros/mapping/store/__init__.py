"""The map and trajectory in memory, and what a live view samples of them."""
