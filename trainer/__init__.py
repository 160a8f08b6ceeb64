"""Training: binary RL, on-policy distillation and the combined objective, published to the engine."""
