"""Audits of models too large for one device: streamed block by block, or sharded over ranks."""
