"""Pure decisions over plain records: what servesweep decides for its users."""
