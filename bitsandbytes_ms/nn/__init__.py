"""Quantized layers (Linear8bitLt, Linear4bit, embeddings) for mindnlp models."""
