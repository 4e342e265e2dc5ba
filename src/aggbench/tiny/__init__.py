"""The built-in tiny model (a character-level Llama built from config) and its synthetic task."""
