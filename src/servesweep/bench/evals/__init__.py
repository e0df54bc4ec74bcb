"""servesweep.bench.evals."""
