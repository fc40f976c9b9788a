"""Third-party tools: fetch a manifest and its artifact, verify, unpack, remember."""
