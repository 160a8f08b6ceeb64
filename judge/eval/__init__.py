"""The judge's labeled evaluation set and the code that scores voters on it."""
