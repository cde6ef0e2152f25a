"""What a check returns and how it is shown: `_violation` (the records: `Outcome`, `Violation`, `ChildError`),
`_result` (`Result` and one type per check), `_report` (text and JSON; it renders a result without importing
the result types, so the import graph runs one way)."""
