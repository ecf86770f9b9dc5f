"""The gateway's peers: tokenizer (encode), router (pick), engines (generate, retries, breakers)."""
