"""Durable files shared by the agpo and student libraries: atomic, fsynced writes and checksummed checkpoints."""
