"""faust-streaming analytics where at-least-once is safe (windowed counters, health)."""
