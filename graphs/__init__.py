"""Example pathdask programs used by the demo, the benchmarks, the tests and the tutorials."""
