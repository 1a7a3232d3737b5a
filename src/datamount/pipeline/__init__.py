"""Pipeline jobs run on one node, and the YAML kinds beside command jobs
(data assets, components): graph.py (steps, bindings, order), nested.py
(nested pipelines, flattened), steps.py (the command job each step runs
as), runner.py (running them), kinds.py (what a YAML is), commands.py (the
command bodies)."""
