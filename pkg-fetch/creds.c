// SPDX-License-Identifier: MIT
/*
 * Where credentials for a registry come from: the caller's "USER:PASS",
 * else a docker config file — "credHelpers" for the host, its "auths"
 * entry ("auth" = base64 user:pass, "identitytoken"), then "credsStore" —
 * where a helper is the program docker-credential-<suffix>, run with the
 * server on stdin and answering {"ServerURL","Username","Secret"}.
 *
 * Secrets are wiped before their memory is freed and never logged.
 */
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "../pkg-base/base.h"
#include "internal.h"

#define AUTHFILE_MAX (1u << 20)
#define HELPER_OUT_MAX (64u << 10)
#define HELPER_TIMEOUT_MS 10000
#define HELPER_NAME_MAX 64

extern char **environ;

static void free_secret(char *s)
{
	if (s) {
		OPENSSL_cleanse(s, strlen(s));
		free(s);
	}
}

void fetch_creds_clear(struct fetch_creds *c)
{
	free(c->user);
	free_secret(c->secret);
	free(c->helper);
	memset(c, 0, sizeof(*c));
}

/* Printable, no control bytes: these go into headers and forms. */
static bool cred_text_ok(const char *s, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

/*
 * An "auths" / "credHelpers" key names @host when it equals it after
 * dropping a http(s):// prefix and any path ("https://h:5000/v1/").
 * Docker Hub's historical key stands for its registry host names.
 */
bool fetch_cfg_key_matches(const char *key, const char *host)
{
	static const char *const hub[] = { "docker.io", "index.docker.io",
					   "registry-1.docker.io" };
	size_t klen, i;
	bool key_hub = false, host_hub = false;

	if (!strncasecmp(key, "https://", 8))
		key += 8;
	else if (!strncasecmp(key, "http://", 7))
		key += 7;
	klen = strcspn(key, "/");
	if (klen == strlen(host) && !strncasecmp(key, host, klen))
		return true;
	for (i = 0; i < ARRAY_SIZE(hub); i++) {
		if (strlen(hub[i]) == klen && !strncasecmp(key, hub[i], klen))
			key_hub = true;
		if (!strcasecmp(host, hub[i]))
			host_hub = true;
	}
	return key_hub && host_hub;
}

static bool helper_name_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (!n || n > HELPER_NAME_MAX || s[0] == '.' || s[0] == '-')
		return false;
	for (i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || strchr("._-", s[i])))
			return false;
	return true;
}

static int set_helper(struct fetch_creds *out, const char *name)
{
	if (!helper_name_ok(name))
		return -EINVAL;
	out->helper = strdup(name);
	if (!out->helper)
		return -ENOMEM;
	out->kind = FETCH_CREDS_HELPER;
	return 0;
}

/* "user:pass" (the decoded "auth" field) into @out. */
static int split_user_pass(const char *s, size_t len, struct fetch_creds *out)
{
	const char *colon = memchr(s, ':', len);

	if (!colon || colon == s || !cred_text_ok(s, len))
		return -EINVAL;
	out->user = strndup(s, (size_t)(colon - s));
	out->secret = strndup(colon + 1, len - (size_t)(colon - s) - 1);
	if (!out->user || !out->secret)
		return -ENOMEM;
	return 0;
}

static int auths_entry(struct json_object *e, struct fetch_creds *out)
{
	const char *auth = json_get_string(e, "auth");
	const char *tok = json_get_string(e, "identitytoken");
	const char *user = json_get_string(e, "username");
	const char *pass = json_get_string(e, "password");
	int err;

	if (auth && *auth) {
		uint8_t dec[3 * 1024];
		size_t n;

		err = base64_decode(auth, strlen(auth), dec, sizeof(dec) - 1,
				    &n);
		if (!err && memchr(dec, '\0', n))
			err = -EINVAL;
		if (!err)
			err = split_user_pass((const char *)dec, n, out);
		OPENSSL_cleanse(dec, sizeof(dec));
		if (err)
			return err;
		out->kind = FETCH_CREDS_BASIC;
	} else if (user && *user && pass && *pass) {
		if (!cred_text_ok(user, strlen(user)) ||
		    !cred_text_ok(pass, strlen(pass)))
			return -EINVAL;
		out->user = strdup(user);
		out->secret = strdup(pass);
		if (!out->user || !out->secret)
			return -ENOMEM;
		out->kind = FETCH_CREDS_BASIC;
	}
	/* An identity token is an OAuth2 refresh token: it wins. */
	if (tok && *tok) {
		if (!cred_text_ok(tok, strlen(tok)))
			return -EINVAL;
		free_secret(out->secret);
		out->secret = strdup(tok);
		if (!out->secret)
			return -ENOMEM;
		out->kind = FETCH_CREDS_TOKEN;
	}
	return 0;
}

int fetch_dockercfg_lookup(const char *json, size_t len, const char *host,
			   struct fetch_creds *out)
{
	struct json_object *root, *helpers, *auths;
	const char *store;
	int err = 0;

	memset(out, 0, sizeof(*out));
	if (json_parse_object(json, len, &root))
		return -EINVAL;
	if (json_object_object_get_ex(root, "credHelpers", &helpers) &&
	    json_object_is_type(helpers, json_type_object)) {
		json_object_object_foreach(helpers, key, val) {
			if (!json_object_is_type(val, json_type_string) ||
			    !fetch_cfg_key_matches(key, host))
				continue;
			err = set_helper(out, json_object_get_string(val));
			goto out;
		}
	}
	if (json_object_object_get_ex(root, "auths", &auths) &&
	    json_object_is_type(auths, json_type_object)) {
		json_object_object_foreach(auths, key, val) {
			if (!json_object_is_type(val, json_type_object) ||
			    !fetch_cfg_key_matches(key, host))
				continue;
			err = auths_entry(val, out);
			if (err || out->kind != FETCH_CREDS_NONE)
				goto out;
		}
	}
	store = json_get_string(root, "credsStore");
	if (store && *store)
		err = set_helper(out, store);
out:
	json_object_put(root);
	if (err)
		fetch_creds_clear(out);
	return err;
}

int fetch_helper_output_parse(const char *json, size_t len,
			      struct fetch_creds *out)
{
	struct json_object *root;
	const char *user, *secret;
	int err = -EINVAL;

	memset(out, 0, sizeof(*out));
	if (json_parse_object(json, len, &root))
		return -EINVAL;
	user = json_get_string(root, "Username");
	secret = json_get_string(root, "Secret");
	if (!secret || !*secret || !cred_text_ok(secret, strlen(secret)) ||
	    (user && !cred_text_ok(user, strlen(user))))
		goto out;
	err = -ENOMEM;
	if (user && !strcmp(user, "<token>")) {
		out->kind = FETCH_CREDS_TOKEN;
	} else {
		if (!user || !*user) {
			err = -EINVAL;
			goto out;
		}
		out->kind = FETCH_CREDS_BASIC;
		out->user = strdup(user);
		if (!out->user)
			goto out;
	}
	out->secret = strdup(secret);
	if (!out->secret)
		goto out;
	err = 0;
out:
	json_object_put(root);
	if (err)
		fetch_creds_clear(out);
	return err;
}

/* Read the child's stdout until EOF, @cap bytes or the deadline. */
static int helper_read(int fd, char *buf, size_t cap, size_t *len,
		       uint64_t deadline_ns)
{
	size_t n = 0;

	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		uint64_t now = ferry_now_ns();
		ssize_t k;
		int rc;

		if (now >= deadline_ns)
			return -ETIMEDOUT;
		rc = poll(&pfd, 1, (int)((deadline_ns - now) / 1000000 + 1));
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0)
			return -errno;
		if (rc == 0)
			continue;
		k = read(fd, buf + n, cap - n);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		n += (size_t)k;
		if (n == cap)
			return -EFBIG;
	}
	*len = n;
	return 0;
}

/* Reap @pid, killing it once the deadline has passed. */
static int helper_wait(pid_t pid, uint64_t deadline_ns)
{
	bool killed = false;
	int status;

	for (;;) {
		struct timespec ts = { 0, 5 * 1000 * 1000 };
		pid_t w = waitpid(pid, &status, WNOHANG);

		if (w == pid)
			break;
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -errno;
		if (!killed && ferry_now_ns() >= deadline_ns) {
			kill(pid, SIGKILL);
			killed = true;
		}
		nanosleep(&ts, NULL);
	}
	if (killed)
		return -ETIMEDOUT;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int fetch_run_cred_helper(const char *suffix, const char *server,
			  struct fetch_creds *out)
{
	char prog[sizeof("docker-credential-") + HELPER_NAME_MAX];
	char *argv[] = { prog, (char *)"get", NULL };
	posix_spawn_file_actions_t fa;
	uint64_t deadline = ferry_now_ns() + HELPER_TIMEOUT_MS * 1000000ull;
	int in[2] = { -1, -1 }, outp[2] = { -1, -1 };
	char *buf = NULL;
	size_t len = 0;
	pid_t pid = -1;
	int err, rc;

	memset(out, 0, sizeof(*out));
	if (!helper_name_ok(suffix))
		return -EINVAL;
	snprintf(prog, sizeof(prog), "docker-credential-%s", suffix);
	buf = malloc(HELPER_OUT_MAX);
	if (!buf)
		return -ENOMEM;
	/* stdin is a socket so that writing to a helper that exited
	 * early gives EPIPE (MSG_NOSIGNAL) instead of killing us. */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) < 0 ||
	    pipe2(outp, O_CLOEXEC) < 0) {
		err = -errno;
		goto out;
	}
	err = -posix_spawn_file_actions_init(&fa);
	if (err)
		goto out;
	if ((err = -posix_spawn_file_actions_adddup2(&fa, in[1], 0)) ||
	    (err = -posix_spawn_file_actions_adddup2(&fa, outp[1], 1)) ||
	    (err = -posix_spawn_file_actions_addopen(&fa, 2, "/dev/null",
						     O_WRONLY, 0))) {
		posix_spawn_file_actions_destroy(&fa);
		goto out;
	}
	rc = posix_spawnp(&pid, prog, &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (rc) {
		pid = -1;
		err = rc == ENOENT ? -ENOENT : -rc;
		ferry_warn("credential helper %s for %s: cannot run: %s", prog,
			   server, strerror(rc));
		goto out;
	}
	close(in[1]);
	close(outp[1]);
	in[1] = outp[1] = -1;
	if (send(in[0], server, strlen(server), MSG_NOSIGNAL) < 0)
		ferry_dbg("credential helper %s: writing stdin: %s", prog,
			  strerror(errno));
	shutdown(in[0], SHUT_WR);
	err = helper_read(outp[0], buf, HELPER_OUT_MAX, &len, deadline);
	rc = helper_wait(pid, err ? 0 : deadline);
	pid = -1;
	if (err || rc < 0) {
		err = err ? err : rc;
		ferry_warn("credential helper %s for %s: %s", prog, server,
			   err == -EFBIG ? "answer too large" :
					   ferry_strerror(err));
		goto out;
	}
	if (rc != 0) {
		/* "credentials not found" and friends: no credentials. */
		ferry_dbg("credential helper %s for %s exited with %d", prog,
			  server, rc);
		err = -ENOENT;
		goto out;
	}
	err = fetch_helper_output_parse(buf, len, out);
	if (err)
		ferry_warn("credential helper %s for %s: malformed answer",
			   prog, server);
out:
	if (pid > 0)
		helper_wait(pid, 0);
	if (in[0] >= 0)
		close(in[0]);
	if (in[1] >= 0)
		close(in[1]);
	if (outp[0] >= 0)
		close(outp[0]);
	if (outp[1] >= 0)
		close(outp[1]);
	OPENSSL_cleanse(buf, HELPER_OUT_MAX);
	free(buf);
	return err;
}

char *fetch_authfile_path(const struct fetch_opts *opts, bool *explicit_path)
{
	const char *env;
	char *p = NULL;

	*explicit_path = true;
	if (opts->authfile)
		return strdup(opts->authfile);
	env = getenv("REGISTRY_AUTH_FILE");
	if (env && *env)
		return strdup(env);
	*explicit_path = false;
	env = getenv("DOCKER_CONFIG");
	if (env && *env) {
		if (asprintf(&p, "%s/config.json", env) < 0)
			return NULL;
		return p;
	}
	env = getenv("HOME");
	if (env && *env) {
		if (asprintf(&p, "%s/.docker/config.json", env) < 0)
			return NULL;
		return p;
	}
	return NULL;
}

/*
 * @fd until EOF into @buf (@size bytes, NUL-terminated, one trailing
 * newline dropped): 0, -EFBIG when it does not fit, or -errno.
 */
static int read_secret(int fd, char *buf, size_t size)
{
	size_t len = 0;
	ssize_t n;

	while (len < size && (n = read(fd, buf + len, size - len)) != 0) {
		if (n < 0 && errno != EINTR)
			return -errno;
		len += n > 0 ? (size_t)n : 0;
	}
	if (len == size)
		return -EFBIG;
	if (len && buf[len - 1] == '\n')
		len--;
	if (len && buf[len - 1] == '\r')
		len--;
	buf[len] = '\0';
	return 0;
}

/* "USER:PASS" in @s: a user, a colon, a password, no control bytes. */
static bool creds_ok(const char *s)
{
	const char *colon = strchr(s, ':');

	return colon && colon != s && colon[1] && cred_text_ok(s, strlen(s));
}

/*
 * Complete @out (its first @off bytes set) from @fd: 0 when it then holds
 * one line USER:PASS, -EBADMSG when not, or -errno; wiped on failure.
 */
static int read_creds(int fd, char out[FETCH_CREDS_MAX + 1], size_t off)
{
	int ret = read_secret(fd, out + off, FETCH_CREDS_MAX + 1 - off);

	if (ret == -EFBIG || (!ret && !creds_ok(out)))
		ret = -EBADMSG;
	if (ret)
		OPENSSL_cleanse(out, FETCH_CREDS_MAX + 1);
	return ret;
}

int fetch_creds_file(const char *path, char out[FETCH_CREDS_MAX + 1])
{
	struct stat st;
	int fd, ret;

	fd = open(path, O_RDONLY | O_NOCTTY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		ret = -errno;
		ferry_err("credentials file %s: %s", path, strerror(-ret));
	} else if (!S_ISREG(st.st_mode)) {
		ret = -EBADMSG;
		ferry_err("credentials file %s: not a regular file", path);
	} else if (st.st_mode & 077) {
		ret = -EACCES;
		ferry_err("credentials file %s: group or others may access it (mode %04o); let only its owner read it: chmod 600 %s",
			  path, (unsigned int)(st.st_mode & 07777), path);
	} else {
		ret = read_creds(fd, out, 0);
		if (ret == -EBADMSG)
			ferry_err("credentials file %s: expected one line USER:PASS of at most %u bytes",
				  path, FETCH_CREDS_MAX);
		else if (ret)
			ferry_err("credentials file %s: %s", path, strerror(-ret));
	}
	if (fd >= 0)
		close(fd);
	return ret;
}

int fetch_creds_password(int fd, const char *user, char out[FETCH_CREDS_MAX + 1])
{
	size_t ulen = strlen(user);
	int ret = -EBADMSG;

	if (ulen + 2 <= FETCH_CREDS_MAX && !strchr(user, ':')) {
		memcpy(out, user, ulen);
		out[ulen] = ':';
		ret = read_creds(fd, out, ulen + 1);
	}
	if (ret == -EBADMSG)
		ferry_err("password of %s from standard input: expected a user without ':' and a one-line password, at most %u bytes together",
			  user, FETCH_CREDS_MAX);
	else if (ret)
		ferry_err("password of %s from standard input: %s", user, strerror(-ret));
	return ret;
}

int fetch_creds_from_options(const char *creds, const char *file, const char *user,
			     bool password_stdin, char buf[FETCH_CREDS_MAX + 1],
			     const char **out)
{
	bool user_only = creds && !strchr(creds, ':');
	int ret;

	*out = NULL;
	if (password_stdin) {
		/* The user from --username (docker login) or --creds USER (skopeo). */
		if (file || (user ? creds != NULL : !user_only))
			goto usage;
		ret = fetch_creds_password(STDIN_FILENO, user ?: creds, buf);
	} else if (file) {
		if (creds || user)
			goto usage;
		ret = fetch_creds_file(file, buf);
	} else if (user || user_only) {
		goto usage;
	} else {
		*out = creds;
		return 0;
	}
	if (!ret)
		*out = buf;
	return ret;
usage:
	ferry_err("credentials: give one of --creds USER:PASS, --creds-file FILE, or --password-stdin with --username USER (or --creds USER)");
	return -EINVAL;
}

int fetch_load_creds(const struct fetch_opts *opts, const char *host,
		     struct fetch_creds *out)
{
	struct fetch_creds cfg;
	bool explicit_path;
	char *path, *text = NULL;
	size_t len = 0;
	int err;

	memset(out, 0, sizeof(*out));
	if (opts->creds) {
		err = split_user_pass(opts->creds, strlen(opts->creds), out);
		if (err) {
			fetch_creds_clear(out);
			ferry_err("credentials for %s: expected USER:PASS", host);
			return err;
		}
		out->kind = FETCH_CREDS_BASIC;
		return 0;
	}
	path = fetch_authfile_path(opts, &explicit_path);
	if (!path)
		return 0;
	err = read_file_max(path, AUTHFILE_MAX, &text, &len);
	if (err) {
		if (explicit_path || err != -ENOENT) {
			ferry_err("auth file %s: %s", path,
				  err == -EFBIG || err == -EINVAL ?
				  "not a regular file of at most 1 MiB" :
						  ferry_strerror(err));
			free(path);
			return err;
		}
		free(path);
		return 0;
	}
	err = fetch_dockercfg_lookup(text, len, host, &cfg);
	OPENSSL_cleanse(text, len);
	free(text);
	if (err) {
		ferry_err("auth file %s: malformed (credentials for %s)", path,
			  host);
		free(path);
		return err;
	}
	if (cfg.kind == FETCH_CREDS_HELPER) {
		/* Helpers know the Hub by the key docker login stores. */
		err = fetch_run_cred_helper(cfg.helper,
					    fetch_cfg_key_matches(FETCH_HUB, host) ?
						    FETCH_HUB_CONFIG_KEY : host,
					    out);
		if (err == -ENOENT || err == -EINVAL) {
			/* The helper has nothing for this host. */
			err = 0;
		}
		fetch_creds_clear(&cfg);
	} else {
		*out = cfg;
	}
	if (!err && out->kind != FETCH_CREDS_NONE)
		ferry_dbg("credentials for %s from %s", host, path);
	free(path);
	return err;
}
