"""Pure domain logic: no I/O, no framework. Everything here is testable with plain values."""
