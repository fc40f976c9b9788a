"""The pieces of ``bench/run.py``: references (floor, peer), daemons, figures, report."""
