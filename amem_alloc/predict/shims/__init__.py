"""torch.cuda under prediction: the calls scripts make, answered from the chosen card and the
predicted run (cuda.py: the table of stand-ins; devices.py: the fake device objects; live.py: the
allocator fed as the run goes, for mid-script memory questions)."""
