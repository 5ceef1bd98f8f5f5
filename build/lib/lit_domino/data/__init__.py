"""Data: embedded corpora, benchmark prompt sets, regenerated training data, the DataModule."""
