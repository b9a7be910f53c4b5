"""Text in: the registry sources (registry) and their readers (readers, rdata), a fetched source's
record (fetched), and the sources people hold (sources, jsonline)."""
