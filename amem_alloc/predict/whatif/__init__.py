"""What would make it fit: the changes amem can apply to a run (changes.py), the what-ifs asked
and answered (answers.py, run.py), and `amem fit`'s search over a script's own argument (fit.py,
trial.py)."""
