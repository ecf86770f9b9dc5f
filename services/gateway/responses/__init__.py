"""OpenAI's Responses API on the chat pipeline: request, translation, output, store."""
