"""KV bookkeeping: the block pool, the managers that hand blocks to sequences, sizing, the map."""
