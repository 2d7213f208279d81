"""Mixture-of-experts layers: the routers (`router.py`), the stacked experts run as grouped matmuls
(`experts.py`) and the sparse MLP block composing them with an optional shared expert
(`block.py`); `config.py` is the torch-free description a model family fills in."""
