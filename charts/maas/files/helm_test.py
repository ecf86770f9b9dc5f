"""`helm test`: one chat completion through the release's gateway, checked for its shape.

The chart runs this file with `python -c` in the maas image (templates/tests/), so
it uses the standard library only. It exits 0 when the gateway answered a
completion in OpenAI's shape, 1 when it answered something else (the status and
body are printed), 2 when it was given no API key. A gateway that is not
answering yet (connection refused, 502/503/504 while engines load) is asked again
until MAAS_TEST_WAIT_SECONDS have passed.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

RETRY_STATUSES = {502, 503, 504}
NO_KEY = """no API key: create a tenant's key and put it in the Secret the test reads, e.g.
  kubectl -n NAMESPACE exec deploy/RELEASE-gateway -- maas tenants create --name helm-test --json
  kubectl -n NAMESPACE create secret generic RELEASE-helm-test --from-literal=api-key=KEY
(values tests.apiKeySecret and tests.apiKeySecretKey name another Secret and key)"""


def shape_problems(answer: object) -> list[str]:
    """What makes this body not an OpenAI chat completion with an answer and usage."""
    if not isinstance(answer, dict):
        return ["the body is not a JSON object"]
    problems = []
    if answer.get("object") != "chat.completion":
        problems.append(f"object is {answer.get('object')!r}, not 'chat.completion'")
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        return [*problems, "no choices"]
    choice = choices[0]
    message = choice.get("message") or {}
    if message.get("role") != "assistant":
        problems.append(f"the message's role is {message.get('role')!r}")
    if not isinstance(message.get("content"), str) or not message["content"]:
        problems.append("the message has no text")
    if choice.get("finish_reason") not in ("stop", "length"):
        problems.append(f"finish_reason is {choice.get('finish_reason')!r}")
    usage = answer.get("usage") or {}
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not (isinstance(prompt, int) and prompt > 0 and isinstance(completion, int)):
        problems.append(f"usage is {usage!r}")
    elif completion < 1 or usage.get("total_tokens") != prompt + completion:
        problems.append(f"usage does not add up: {usage!r}")
    return problems


def ask(url: str, key: str, model: str) -> tuple[int, bytes]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def main() -> int:
    url, model = os.environ["MAAS_GATEWAY_URL"], os.environ["MAAS_TEST_MODEL"]
    key = os.environ.get("MAAS_API_KEY", "")
    if not key:
        print(NO_KEY, file=sys.stderr)
        return 2
    deadline = time.monotonic() + float(os.environ.get("MAAS_TEST_WAIT_SECONDS", "120"))
    while True:
        try:
            status, body = ask(url, key, model)
        except OSError as error:  # refused, reset, DNS: the gateway is not up yet
            status, body = 0, str(error).encode()
        if status not in (0, *RETRY_STATUSES) or time.monotonic() > deadline:
            break
        time.sleep(3)
    if status != 200:
        print(f"{url}: HTTP {status}: {body[:1000].decode(errors='replace')}", file=sys.stderr)
        return 1
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    problems = shape_problems(answer)
    if problems:
        print(f"{url}: not a chat completion: {'; '.join(problems)}", file=sys.stderr)
        return 1
    print(f"{model} answered: {answer['choices'][0]['message']['content']!r} ({answer['usage']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
