"""The Harris tokenizer: its rule and files (harris), its compiled loops (_harris.c), its trainer
(train), the sample of text it is fitted on (sample), and its word tokens judged on a text (words)."""
