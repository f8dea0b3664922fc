// SPDX-License-Identifier: MIT
/*
 * ferryd-keeper: the keepers of ferryd's mounts, a program of its own so
 * that starting one (on every FUSE and fanotify mount's path) loads
 * neither libcurl, OpenSSL, libfuse nor the codecs: it links what it
 * calls of libferry.a, json-c and libc. The program is pkg-serve's
 * (keeper_main.c, keeper.h).
 */
#include "../../pkg-serve/serve.h"

int main(int argc, char **argv)
{
	return serve_keeper_main(argc, argv);
}
