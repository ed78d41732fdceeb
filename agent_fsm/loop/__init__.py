"""Deciding, with no I/O: the guards over a run's state, loop detection, the verifier that
proves a table terminates, and the ``transitions`` machine built from the verified table."""
