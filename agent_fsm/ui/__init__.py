"""``agent-fsm ui``: watch and steer the runs of a store in a browser (the ``ui`` extra).

A view over what the library already keeps, never a second engine: the runs a store lists
(``runs``), one run's path drawn on its table (``layout``) with a step-through of its
transitions (``steps``), the engine's typed events as an AG-UI stream (``agui``), and the
resume and cancel API for steering (``app``). Only ``app`` and ``cli``'s server start import
Starlette and uvicorn; the rest is plain Python the core could run, and the core imports
none of it but the command's registration (``ui.cli.add_ui_command``).
"""
