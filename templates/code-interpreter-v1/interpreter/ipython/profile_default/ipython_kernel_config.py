# The Python kernel of the code interpreter: plain tracebacks (no terminal colours) and whole
# collections in a result's text.
c = get_config()  # noqa: F821
c.InteractiveShell.colors = "nocolor"
c.PlainTextFormatter.max_seq_length = 0
