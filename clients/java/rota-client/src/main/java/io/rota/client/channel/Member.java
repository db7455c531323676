package io.rota.client.channel;

/** One instance as the channel routes to it: its id, address, version and weight. */
record Member(String id, String host, int port, String version, int weight) {
}
