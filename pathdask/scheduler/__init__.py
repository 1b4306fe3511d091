"""The control plane: the scheduler plugin, the resource manager and the island scheduler."""
