"""The experiments of `andrea experiment`: position schemes, and which rows of wte each optimizer moves."""
