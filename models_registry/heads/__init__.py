"""Feature-conditioned draft heads: training (train.py, ttt.py) and the command line (cli.py)."""
