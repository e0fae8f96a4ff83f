"""Settings resolution (argument -> environment -> default, as the TypeScript SDK) and address parsing."""

import unittest

import forkd
from forkd.settings import parse_daemon_url, resolve_settings


class SettingsResolution(unittest.TestCase):
    def test_defaults_to_the_daemons_unix_socket_without_a_token(self) -> None:
        settings = resolve_settings(env={})
        self.assertEqual(settings.address.kind, "unix")
        self.assertEqual(settings.address.socket_path, "/run/forkd/forkd.sock")
        self.assertEqual(settings.address_source, "the default address")
        self.assertIsNone(settings.token)
        self.assertEqual(settings.request_timeout, 60.0)

    def test_environment_then_argument(self) -> None:
        env = {"FORKD_URL": "http://127.0.0.1:8889", "FORKD_TOKEN": "env-token-0123456789"}
        from_env = resolve_settings(env=env)
        self.assertEqual((from_env.address.host, from_env.address.port), ("127.0.0.1", 8889))
        self.assertEqual((from_env.address_source, from_env.token, from_env.token_source),
                         ("FORKD_URL", "env-token-0123456789", "FORKD_TOKEN"))
        from_args = resolve_settings(url="unix:/tmp/x.sock", token="arg-token-0123456789", env=env)
        self.assertEqual((from_args.address.socket_path, from_args.token), ("/tmp/x.sock", "arg-token-0123456789"))
        self.assertEqual(from_args.address_source, "the `url` argument")
        # A blank variable counts as unset.
        self.assertEqual(resolve_settings(env={"FORKD_URL": "  "}).address_source, "the default address")

    def test_per_call_request_timeout_wins(self) -> None:
        self.assertEqual(resolve_settings(request_timeout=5, env={}).request_timeout, 5.0)
        self.assertEqual(resolve_settings(request_timeout=5, call_request_timeout=0, env={}).request_timeout, 0.0)

    def test_controller_reads_the_environment_at_each_call(self) -> None:
        env = {"FORKD_URL": "http://127.0.0.1:1"}
        controller = forkd.Controller(env=env)
        self.assertEqual(controller.base_url, "http://127.0.0.1:1")
        self.assertEqual(forkd.Controller("http://h:2", env=env).base_url, "http://h:2")
        self.assertEqual(forkd.Controller(base_url="http://h:3", env=env).base_url, "http://h:3")
        with self.assertRaises(forkd.InvalidArgumentError):
            forkd.Controller("http://a:1", base_url="http://b:1")

    def test_bad_values_name_where_they_came_from(self) -> None:
        with self.assertRaisesRegex(forkd.InvalidArgumentError, r"FORKD_URL is 'tcp://x:1': unsupported scheme tcp:"):
            resolve_settings(env={"FORKD_URL": "tcp://x:1"})
        with self.assertRaisesRegex(forkd.InvalidArgumentError, "must be absolute"):
            forkd.Controller("unix:relative.sock")
        with self.assertRaisesRegex(forkd.InvalidArgumentError, "no credentials"):
            forkd.Controller("http://user:pw@host:1", env={})
        with self.assertRaisesRegex(forkd.InvalidArgumentError, "token from FORKD_TOKEN"):
            forkd.Controller(env={"FORKD_TOKEN": "has space"})
        with self.assertRaisesRegex(forkd.InvalidArgumentError, "request_timeout must be"):
            forkd.Controller(timeout=-1, env={})
        with self.assertRaisesRegex(forkd.InvalidArgumentError, "header"):
            forkd.Controller(headers={"X-Bad": "a\r\nb"}, env={})

    def test_address_forms(self) -> None:
        self.assertEqual(parse_daemon_url("unix:///run/x.sock").socket_path, "/run/x.sock")
        https = parse_daemon_url("https://forkd.example:9443/prefix/")
        self.assertEqual((https.scheme, https.port, https.base_path), ("https", 9443, "/prefix"))
        self.assertEqual(parse_daemon_url("http://[::1]:8889").host, "::1")
        self.assertEqual(parse_daemon_url("http://host").port, 80)


class ErrorTree(unittest.TestCase):
    def test_one_tree_and_the_builtins_of_the_same_names(self) -> None:
        for cls in (forkd.TimeoutError, forkd.ConnectionError, forkd.NotImplementedError, forkd.CommandExitError,
                    forkd.SandboxNotFoundError, forkd.CancelledError):
            self.assertTrue(issubclass(cls, forkd.ForkdError), cls)
        self.assertTrue(issubclass(forkd.TimeoutError, TimeoutError))
        self.assertTrue(issubclass(forkd.ConnectionError, ConnectionError))
        self.assertTrue(issubclass(forkd.NotImplementedError, NotImplementedError))
        self.assertTrue(issubclass(forkd.SandboxNotFoundError, forkd.NotFoundError))
        self.assertIs(forkd.ControllerError, forkd.ForkdError)
        self.assertTrue(issubclass(forkd.ControllerError, RuntimeError), "v0.5's ControllerError was a RuntimeError")

    def test_command_exit_error_carries_the_output(self) -> None:
        err = forkd.CommandExitError("'make'", exit_code=2, stdout="out", stderr="line 1\nboom")
        self.assertEqual((err.exit_code, err.stdout, err.stderr), (2, "out", "line 1\nboom"))
        self.assertEqual(str(err), "command 'make' exited with code 2: boom")


if __name__ == "__main__":
    unittest.main()
