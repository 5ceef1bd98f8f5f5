"""The runtime layer: what every command and study stands on (command-line conventions; more to move here)."""
