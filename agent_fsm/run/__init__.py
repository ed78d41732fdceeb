"""One run: the engine that steps the machine, the work each state does (observe, think, act,
reflect), how a run ends, how a stopped run is answered and resumed, and where a run lives
(``run.residence``: the one seam between the engine and storage). Users reach it through
``Agent``; ``Run`` is re-exported from ``agent_fsm``."""
