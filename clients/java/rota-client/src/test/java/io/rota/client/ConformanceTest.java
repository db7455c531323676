package io.rota.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.stream.Stream;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.extension.ExtendWith;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import io.rota.client.testing.RotaServer;
import io.rota.client.testing.SharedRotaServer;

/**
 * Runs every scenario of {@code clients/conformance/scenarios/} (see {@link ScenarioRun}) against
 * the shared live server; a scenario that stops its server gets one of its own.
 */
@ExtendWith(SharedRotaServer.class)
class ConformanceTest {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final AtomicInteger FILES = new AtomicInteger(-1);
    private static final AtomicInteger PASSED = new AtomicInteger();

    @TestFactory
    Stream<DynamicTest> scenarios(RotaServer rota) throws IOException {
        Path dir = RotaServer.repositoryRoot().resolve("clients/conformance/scenarios");
        List<Path> files;
        try (Stream<Path> listing = Files.list(dir)) {
            files = listing.filter(p -> p.getFileName().toString().endsWith(".json")).sorted().toList();
        }
        assertFalse(files.isEmpty(), "no scenarios in " + dir);
        FILES.set(files.size());
        return files.stream().map(file -> DynamicTest.dynamicTest(file.getFileName().toString(), file.toUri(),
                () -> {
                    JsonNode scenario = JSON.readTree(file.toFile());
                    Assertions.assertTimeoutPreemptively(Duration.ofSeconds(90), () -> {
                        if (ScenarioRun.stopsTheServer(scenario)) {
                            try (RotaServer own = RotaServer.start()) {
                                ScenarioRun.run(own, scenario);
                            }
                        } else {
                            ScenarioRun.run(rota, scenario);
                        }
                    });
                    PASSED.incrementAndGet();
                }));
    }

    /** Every scenario file ran and passed: a run that skipped some (or all) of them fails. */
    @AfterAll
    static void everyScenarioRan() {
        assertEquals(FILES.get(), PASSED.get(), "scenarios passed of the files found");
    }

    @Test
    void aWrongExpectationFailsTheScenario(RotaServer rota) throws IOException {
        String scenario = """
                { "name": "runner self-check", "steps": [
                  { "op": "register", "stream": "p", "instances": [
                    { "service": "conf-selfcheck", "id": "a", "host": "127.0.0.1", "port": 7001 } ] },
                  { "op": "pick", "request": { "service": "conf-selfcheck", "rule": "round_robin" },
                    "expect": { "id": "b" } } ] }
                """;
        AssertionError wrong = Assertions.assertThrows(AssertionError.class, () -> ScenarioRun.run(rota, JSON.readTree(scenario)));
        assertTrue(wrong.getMessage().contains("step 1 (pick)"), wrong.getMessage());
        assertTrue(wrong.getMessage().contains("picked id"), wrong.getMessage());

        String local = """
                { "name": "runner self-check 2", "steps": [
                  { "op": "register", "stream": "p", "instances": [
                    { "service": "conf-selfcheck-local", "id": "a", "host": "127.0.0.1", "port": 7001 } ] },
                  { "op": "pick_sequence", "connections": [0], "count": 1, "request": { "service": "conf-selfcheck-local" },
                    "expect_ids": ["a"], "expect_local": true } ] }
                """;
        AssertionError notLocal = Assertions.assertThrows(AssertionError.class, () -> ScenarioRun.run(rota, JSON.readTree(local)));
        assertTrue(notLocal.getMessage().contains("made locally"), notLocal.getMessage());

        // Positions are compared exactly, and exclude is sent: b excluded, ticket 1 goes to c.
        String lease = """
                { "name": "runner self-check 3", "steps": [
                  { "op": "register", "stream": "p", "instances": [
                    { "service": "conf-selfcheck-lease", "id": "a", "host": "127.0.0.1", "port": 7001 },
                    { "service": "conf-selfcheck-lease", "id": "b", "host": "127.0.0.1", "port": 7002 },
                    { "service": "conf-selfcheck-lease", "id": "c", "host": "127.0.0.1", "port": 7003 } ] },
                  { "op": "lease", "request": { "service": "conf-selfcheck-lease", "rule": "round_robin", "count": 2,
                      "exclude": ["b"] },
                    "expect": { "first_ticket": 0, "count": 2, "ids": ["a", "c"], "positions": [0, 0] } } ] }
                """;
        AssertionError positions = Assertions.assertThrows(AssertionError.class, () -> ScenarioRun.run(rota, JSON.readTree(lease)));
        assertTrue(positions.getMessage().contains("positions"), positions.getMessage());
        assertTrue(positions.getMessage().contains("[0, 1]"), positions.getMessage());
    }

    @Test
    void anUnknownKeyFailsTheScenario(RotaServer rota) throws IOException {
        String misspelt = """
                { "name": "runner self-check", "steps": [
                  { "op": "pick", "request": { "service": "conf-selfcheck-2" },
                    "expect": { "eror": "NOT_FOUND" } } ] }
                """;
        AssertionError e = Assertions.assertThrows(AssertionError.class, () -> ScenarioRun.run(rota, JSON.readTree(misspelt)));
        assertTrue(e.getMessage().contains("\"eror\""), e.getMessage());
        String topLevel = "{ \"name\": \"x\", \"conections\": 2, \"steps\": [] }";
        AssertionError top = Assertions.assertThrows(AssertionError.class, () -> ScenarioRun.run(rota, JSON.readTree(topLevel)));
        assertTrue(top.getMessage().contains("\"conections\""), top.getMessage());
        String outcome = """
                { "name": "x", "steps": [ { "op": "report", "outcomes": [
                  { "service": "s", "instance": "a", "result": "OK" } ] } ] }
                """;
        AssertionError nested = Assertions.assertThrows(AssertionError.class, () -> ScenarioRun.run(rota, JSON.readTree(outcome)));
        assertTrue(nested.getMessage().contains("\"instance\" in outcome"), nested.getMessage());
    }
}
