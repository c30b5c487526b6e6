"""Model-level integration with MindSpore NLP (mindnlp)."""
