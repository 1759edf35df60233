"""Megatron-Core workers: model construction for a role's layout, training and forward passes."""
