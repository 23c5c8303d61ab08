"""N-gram drafting settings shared by the n-gram and coupled tests."""

from __future__ import annotations

from pydflash import NgramConfig

# small lookups so that the tiny random models' loops are found quickly
SMALL = NgramConfig(mod_n_match=4, mod_n_min=1, mod_n_max=24, simple_size_n=3, simple_size_m=16,
                    map_k_size_n=3, map_k_size_m=16)  # fmt: skip
