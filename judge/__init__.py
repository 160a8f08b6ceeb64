"""Next-state judging: every trainable main turn gets m votes from a voter; majority wins."""
