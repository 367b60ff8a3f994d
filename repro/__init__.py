"""repro: reproduce published deep-learning benchmark tables with one command."""

__version__ = "0.1.0"
