"""What a job leaves for its users: the exports, the audit of token ids against the
bills, the report."""
