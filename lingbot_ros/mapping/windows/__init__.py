"""The windowed long-run policy: the window rule, the live policy, the offline run, similarity."""
