"""The chaos suite: the fleet under whole-fleet kills, worker kills, server restarts, duplicates and poison.

``python -m tests.chaos --scale small|full`` (``make chaos`` runs the full scale); ``test_chaos.py``
runs every scenario at the small scale inside ``make test``.
"""
