"""What would make it fit: the changes amem can apply to a run (changes.py), the what-ifs asked
and answered (answers.py, run.py), and one more prediction of the same code as a value (trial.py,
which `amem fit`'s search, predict/fit.py, runs too)."""
