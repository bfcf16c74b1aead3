"""Pairs in: the ``pairs`` contract and its checks (contracts), the synthetic set (synthetic, ``agpo data``), a
team's own files imported (data_import, ingest, readers: ``agpo data import``)."""
