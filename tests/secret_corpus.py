"""The secret shapes Warden redacts, and the ids it must not (``fleet/secrets.py`` is the rule).

One corpus drives every leak test: ``tests/test_secrets.py`` (the redactor and each store),
``tests/test_secret_paths.py`` (every path a secret can travel, end to end) and
``tests/test_regex_fuzz.py`` (planted secrets in generated text).

``SECRETS``: ``(name, text as it would appear, the secret part that must not survive)``.
``NOT_SECRETS``: ``(name, text)`` that must come out of ``redact`` unchanged.
"""

PEM_RSA = """-----BEGIN RSA PRIVATE KEY-----
MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun
VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK
LxoS2tFczGkPLPgizskuemMghRniWaoLcyehkd3qqGElvW/VDL5AaWTg0nLVkjRo
-----END RSA PRIVATE KEY-----"""
PEM_OPENSSH = """-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
QyNTUxOQAAACDd9Yz0kTq5sWQx8p2lW3cYJm6o9v1eXr3Yy7bT0fJ0nQAAAJgyZ2V0Mmdl
-----END OPENSSH PRIVATE KEY-----"""
VAST_KEY = "6f1e3c9a2b7d4e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6b7"

SECRETS = [
    ("openai", "OPENAI key sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb7cDe0fGh3iJk6l in env",
     "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"),
    ("openai_project", "key=sk-proj-Zq8w1E4r7T0y3U6i9O2p5A8s1D4f7G0h3J6k9L2z5X8c1V4b7N0m3Q6w9E2rT3BlbkFJ",
     "Zq8w1E4r7T0y3U6i9O2p5A8s1D4f7G0h3J6k9L2z"),
    ("anthropic", "x-api-key sk-ant-api03-4f3Jk9LmN2pQ7rS1tU5vW8xY0zA3bC6dE9fG2hI5jK8lM1nO4pQ7rS0tU3v-AbCdEfAA",
     "4f3Jk9LmN2pQ7rS1tU5vW8xY0zA3bC6dE9fG2hI5"),
    ("github_classic", "git clone https://ghp_1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6P7q8R@github.com/acme/proving",
     "1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6P7q8R"),
    ("github_fine_grained", "GH_TOKEN=github_pat_11ABCDEFG0123456789abc_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOP",
     "0123456789abcdefghijklmnopqrstuvwxyz"),
    ("aws_access_key_id", "aws_access_key_id = AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("aws_secret_access_key", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
     "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("slack_bot", "SLACK_BOT_TOKEN=xoxb-1234567890123-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
     "AbCdEfGhIjKlMnOpQrStUvWx"),
    ("stripe_live", "charge with sk_live_51HxYzAbCdEfGhIjKlMnOpQr now", "51HxYzAbCdEfGhIjKlMnOpQr"),
    ("huggingface", "HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"),
    ("google", "maps key AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r", "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r"),
    ("jwt", "cookie session=eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwiYWRtaW4iOnRydWV9"
            ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"),
    ("pem_rsa", "found key:\n" + PEM_RSA + "\nend", "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"),
    ("pem_openssh", PEM_OPENSSH, "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW"),
    ("pem_unterminated", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oJ6wSMEg", "MHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oJ6wSMEg"),
    ("bearer_header", "curl -H 'Authorization: Bearer 9f8e7d6c5b4a39281706f5e4d3c2b1a0ffee' https://console.vast.ai/api/v0",
     "9f8e7d6c5b4a39281706f5e4d3c2b1a0ffee"),
    ("basic_header", "Authorization: Basic dXNlcjpodW50ZXIyaHVudGVyMg==", "dXNlcjpodW50ZXIyaHVudGVyMg=="),
    ("token_header", "Authorization: Token 7fa8c2d1e0b94f3a8c6d", "7fa8c2d1e0b94f3a8c6d"),
    ("postgres_url", "HARMONY_DATABASE_URL=postgres://yugabyte:s3cr3t-P4ss@10.0.0.5:5433/yugabyte", "s3cr3t-P4ss"),
    ("redis_url_no_user", "REDIS_URL=redis://:hunter2hunter2@cache:6379/0", "hunter2hunter2"),
    ("password_pair", "login with user=curio password=hunter2hunter2 now", "hunter2hunter2"),
    ("password_is", "the ssh password is Tr0ub4dor&3x for root", "Tr0ub4dor&3x"),
    ("password_is_colon", "Password is: correcthorsebattery", "correcthorsebattery"),
    ("api_key_space", "vast api key: 4d1c7d3e9a2b5c8f0e1d2c3b4a5f6e7d", "4d1c7d3e9a2b5c8f0e1d2c3b4a5f6e7d"),
    ("api_key_space_equals", "API Key = q8w1E4r7T0y3U6i9", "q8w1E4r7T0y3U6i9"),
    ("api_key_yaml", "vast:\n  api_key: 4d1c7d3e9a2b5c8f0e1d2c3b4a5f6e7d\n", "4d1c7d3e9a2b5c8f0e1d2c3b4a5f6e7d"),
    ("api_key_json", '{"api_key": "9f8e7d6c5b4a39281706f5e4d3c2b1a0", "region": "eu"}', "9f8e7d6c5b4a39281706f5e4d3c2b1a0"),
    ("x_api_key_header", "X-Api-Key: 0f9e8d7c6b5a4f3e2d1c", "0f9e8d7c6b5a4f3e2d1c"),
    ("client_secret_json", '{"client_secret": "Zx9-Yw8_Vu7.Ts6"}', "Zx9-Yw8_Vu7.Ts6"),
    ("passphrase", "wallet passphrase: gentle-otter-57-lamp", "gentle-otter-57-lamp"),
    ("cli_flag", "ran: mysql --password S3cretPw9 -h db", "S3cretPw9"),
    # quoted values are secret up to the closing quote, spaces and all; unquoted ones to the next
    # whitespace, punctuation included (inputs a tester once found leaking)
    ("chat_quoted_pair", 'DB creds: {"password": "QuotedPw77xyz"} and password: "correct horse battery staple"',
     "horse battery staple"),
    ("quoted_single_word_json", 'DB creds: {"password": "QuotedPw77xyz"}', "QuotedPw77xyz"),
    ("api_key_quoted_spaces", 'api_key="abc def ghi"', "def ghi"),
    ("password_is_quoted", 'my password is "hunter 2 secret"', "2 secret"),
    ("password_single_quoted", "{'db_password': 'lamp otter 57'}", "otter 57"),
    ("passwd_punctuation_tail", "passwd: Tr0ub4dor&3xQzK9", "3xQzK9"),
    ("cli_flag_quoted", "ran: mysql --password 'pale Blue dot9' -h db", "Blue dot9"),
    ("cli_flag_equals", "ran: curio --api-key=Zq8w1E4r&T0y3U6 run", "T0y3U6"),
    ("bare_hex_64", f"the vast key {VAST_KEY} was rotated", VAST_KEY),
    ("bare_hex_64_line", VAST_KEY, VAST_KEY),
    ("hex_private_key_0x", "exported 0x" + VAST_KEY[::-1] + " from the wallet", VAST_KEY[::-1]),
]

NOT_SECRETS = [
    ("idempotency_key", "idempotency key 3f1c2a9b8e7d6c5b4a39281706f5e4d3c2b1a0ff claimed"),
    ("operator_key", "op:1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"),
    ("instance_ids", "stopped v-1042, local-3 and instance 28371654"),
    ("gpu_uuid", "GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-4e2b1c3d-aaaa-bbbb-cccc-0123456789ab)"),
    ("image_digest", "image vastai/curio@sha256:" + VAST_KEY),
    ("git_commit", "built from c548295e1f0d9a8b7c6d5e4f3a2b1c0d9e8f7a6b"),
    ("dashless_uuid", "request 4e2b1c3daaaabbbbcccc0123456789ab"),
    ("secret_reference", "VAST_API_KEY=env:VAST_API_KEY and ssh key file:/run/secrets/id_ed25519"),
    ("password_file_flag", "manage.py adduser carol --role viewer --password-file /run/secrets/carol"),
    ("prose_password", "the password is required; the api key is missing"),
    ("prose_password_quoted", 'the password is "required", the token is "expired".'),
    ("token_counts", "prompt_tokens: 1234, completion_tokens: 88"),
    ("ordinary_log", "[2026-06-09 16:40:01] lotus-worker: task 4411 done (PoRep, 182.3s)"),
]
