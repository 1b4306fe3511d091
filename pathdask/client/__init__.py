"""What runs in the user's process: clients, sharded arrays, functions and programs."""
