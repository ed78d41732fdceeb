"""One run: the engine that steps the machine, the work each state does (observe, think, act,
reflect), how a run ends, and how a stopped run is answered and resumed. Users reach it
through ``Agent``; ``Run`` is re-exported from ``agent_fsm``."""
