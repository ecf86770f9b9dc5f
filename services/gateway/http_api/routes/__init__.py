"""The HTTP API's routes, one module per OpenAI route family, each an APIRouter."""
