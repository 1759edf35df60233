"""Model families: Hugging Face <-> Megatron-Core descriptions and weight conversion, and tiny test models."""
