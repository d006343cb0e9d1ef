"""One module per system: how to set it up, enqueue, and start its workers."""
