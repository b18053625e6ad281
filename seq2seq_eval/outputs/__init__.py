"""The outputs: rank files merged by id and checked against the data (merge), the output files
streamed in data order (write), their locations checked before any work (locations), and the
summary a finished run prints (summary)."""
