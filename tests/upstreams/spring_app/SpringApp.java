/*
 * Upstream for the differential test: a plain Spring MVC 4.3 app (Debian's libspring-web-servlet-java)
 * in an embedded Jetty 9.4 (Debian's libjetty9-java), knowing nothing about fencing.
 *
 *     tests/upstreams/spring_app/run.sh PORT BUILD_DIR
 *
 * It serves 127.0.0.1:PORT with one DispatcherServlet mapped at "/" and an annotation-configured
 * context (@EnableWebMvc, one @RestController), and implements the record interface of
 * tests/upstreams/README.md plus the typed-id resources (table B) of the shared spec.
 *
 * Spring MVC's defaults are kept on purpose, since they are what the differential test observes
 * (nothing below configures path matching, the UrlPathHelper or content negotiation):
 *   - Suffix pattern matching is ON (useSuffixPatternMatch=true, useRegisteredSuffixPatternMatch
 *     =false): a pattern without a '.' also matches PATTERN + ".*", and that is tried BEFORE the
 *     plain pattern. So /invoices/7.json is invoice:7, /orders/42.json is order:42 and
 *     /orders/4.2e1 is order:4 (the variable is what precedes the last '.').
 *   - Trailing slash matching is ON: /orders/42/ is order:42, /accounts/ is /accounts.
 *   - The UrlPathHelper keeps removeSemicolonContent=true (matrix variables off): everything from
 *     ';' to the next '/' is cut from each segment before matching, so /invoices/7;x=1 is invoice:7
 *     and /invoices;x/7 is invoice:7 too. It decodes the request URI with the request's
 *     character encoding (ISO-8859-1 unless the request's Content-Type names a charset); when that
 *     disagrees with the servlet path Jetty decoded (as UTF-8), Spring falls back to Jetty's
 *     servlet path, so in practice non-ASCII path segments arrive UTF-8-decoded.
 *   - AntPathMatcher: case-sensitive, no token trimming (4.3 default), empty segments skipped
 *     (//invoices//7 is invoice:7; the lookup path keeps the "//").
 *   - Jetty decodes the path and resolves dot segments first, encoded ones too:
 *     /invoices/%2e%2e/7 is other:/7; /invoices/a%2Fb is other:/invoices/a/b; Jetty itself answers
 *     400 to an ambiguous path such as /x/..;/y.
 *   - Conversion is the mvcConversionService: String -> Long is NumberUtils.parseNumber, which
 *     removes ALL whitespace (" 42", "4 2" -> 42), reads hex "0x2A", "0X2A", "#2A" (Long.decode)
 *     and otherwise Long.valueOf (so "+42", "042" and non-ASCII digits such as full-width "４２"
 *     are accepted); String -> UUID is UUID.fromString(s.trim()) (so upper case and the short
 *     "1-2-3-4-5" form are accepted; braces, urn:uuid: and no-hyphen forms are not). A failed
 *     conversion is Spring's own 400 (TypeMismatchException via DefaultHandlerExceptionResolver)
 *     and records nothing. An empty or blank value (?id=, /orders/%20, "X-Shipment;") converts to
 *     null rather than failing in Spring 4.3; the handler then answers 400 (with the header
 *     X-App-Rejected, to tell it from Spring's own) and records nothing.
 *   - A multi-valued parameter or header converted to one Long/UUID takes the FIRST value
 *     (ArrayToObjectConverter); one converted to String is the values joined with ','
 *     (ArrayToStringConverter), so /accounts?id=1&id=2 is acct:1,2.
 *   - @RequestParam reads ServletRequest.getParameter, which in Jetty also includes a
 *     form-encoded (application/x-www-form-urlencoded) body of a POST or PUT: `PUT /ledgers` with
 *     body id=7 is ledger:7. Jetty then has consumed that body, and the record's body is empty.
 *
 * Methods: every @RequestMapping here except the two control endpoints names no method, so it
 * accepts any method Jetty passes through. Jetty 9.4 passes any token as the method, case kept.
 * FrameworkServlet.service (4.3) hands PATCH and any method HttpMethod.resolve does not know
 * (MOVE, COPY, FOO, and lower-case "get" or "put") straight to processRequest; the standard ones
 * go through HttpServlet.service. GET/POST/PUT/DELETE/HEAD reach the handlers (HEAD as "HEAD").
 * OPTIONS is answered by Spring itself (a mapping without methods does not match OPTIONS; Spring
 * answers 200 with an Allow header, no body) and TRACE by HttpServlet.doTrace (an echo), so
 * neither answers {"read": ...} -- both are reads and record nothing, as the interface wants.
 * Every method except GET, HEAD, OPTIONS and TRACE, compared as request.getMethod() reports it
 * (case-sensitive), is a write; "get" is therefore a write, as in the Go upstream.
 *
 * The record's "path" is Spring's lookup path (UrlPathHelper.getLookupPathForRequest: decoded,
 * ';' content removed), the path its handler mapping matched on; "other:<path>" uses it too.
 * Responses are written to the HttpServletResponse directly (no message converters), so content
 * negotiation by suffix (.json, .xml) cannot turn an applied write into a 406.
 *
 * MOVE/COPY Destination is resolved by Spring's OWN RequestMappingHandlerMapping: a request
 * wrapper carries the destination's path (raw as request URI, decoded by Jetty's own HttpURI as
 * servlet path, as Jetty would for a request to it) and query, with method PUT and the real
 * request's headers, and getHandler() on it picks the handler method and its URI variables. Typed
 * ids in a destination are converted with the same mvcConversionService; a failed conversion
 * there, or a path Jetty's URI compliance check refuses (e.g. "/x/..;/y"), is answered 400 and
 * records nothing, as a request to that path would be.
 *
 * Control endpoints (called directly): GET /_record (JSON array of records), POST /_reset.
 * Compiled with --release 8 because Spring 4.3's repackaged ASM/CGLIB predate newer class files.
 * CglibAsmApiFix.java beside this file works around a fault in Debian's spring-core jar (its
 * CGLIB asks its ASM for an API level that ASM refuses), without which no @Configuration
 * class, and so no @EnableWebMvc, can start; it does not touch request handling.
 */

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Enumeration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.logging.Level;
import java.util.logging.Logger;

import javax.servlet.DispatcherType;
import javax.servlet.http.HttpServletRequest;
import javax.servlet.http.HttpServletRequestWrapper;
import javax.servlet.http.HttpServletResponse;

import org.eclipse.jetty.http.HttpCompliance;
import org.eclipse.jetty.http.HttpURI;
import org.eclipse.jetty.server.HttpConnection;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;
import org.eclipse.jetty.util.MultiMap;
import org.eclipse.jetty.util.UrlEncoded;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.beans.factory.annotation.Qualifier;
import org.springframework.context.annotation.Configuration;
import org.springframework.core.convert.ConversionException;
import org.springframework.core.convert.ConversionService;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RequestMapping;
import org.springframework.web.bind.annotation.RequestMethod;
import org.springframework.web.bind.annotation.RequestParam;
import org.springframework.web.bind.annotation.RestController;
import org.springframework.web.context.support.AnnotationConfigWebApplicationContext;
import org.springframework.web.method.HandlerMethod;
import org.springframework.web.servlet.DispatcherServlet;
import org.springframework.web.servlet.HandlerExecutionChain;
import org.springframework.web.servlet.HandlerMapping;
import org.springframework.web.servlet.config.annotation.EnableWebMvc;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;

public class SpringApp {
    /** Kept referenced so the quieted JUL logger is not collected (and reset). */
    private static final Logger ROOT_LOGGER = Logger.getLogger("");

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: SpringApp PORT");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        // Quiet: Jetty's own StdErrLog at WARN, Spring (commons-logging -> JUL) at WARNING.
        System.setProperty("org.eclipse.jetty.util.log.class", "org.eclipse.jetty.util.log.StdErrLog");
        System.setProperty("org.eclipse.jetty.LEVEL", "WARN");
        System.setProperty("org.eclipse.jetty.util.log.announce", "false");
        ROOT_LOGGER.setLevel(Level.WARNING);

        AnnotationConfigWebApplicationContext context = new AnnotationConfigWebApplicationContext();
        context.register(WebConfig.class, RecordController.class);

        Server server = new Server();
        ServerConnector connector = new ServerConnector(server);
        connector.setHost("127.0.0.1");
        connector.setPort(port);
        server.addConnector(connector);

        ServletContextHandler handler = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
        handler.setContextPath("/");
        ServletHolder dispatcher = new ServletHolder("dispatcher", new DispatcherServlet(context));
        dispatcher.setInitOrder(0); // initialise Spring before the port answers /_record
        handler.addServlet(dispatcher, "/");
        server.setHandler(handler);
        server.setStopAtShutdown(true);
        try {
            // Jetty starts the context (Spring) first and binds the port last.
            server.start();
        } catch (Exception e) {
            // A taken port or a failed context: exit, rather than idle on Jetty's live threads.
            e.printStackTrace();
            System.exit(1);
        }
        server.join();
    }

    /** Spring MVC with all its defaults: nothing is overridden. */
    @Configuration
    @EnableWebMvc
    public static class WebConfig {
    }

    @RestController
    public static class RecordController {
        private static final Set<String> READS =
                new HashSet<>(Arrays.asList("GET", "HEAD", "OPTIONS", "TRACE"));

        private final List<Map<String, String>> records = new ArrayList<>();

        @Autowired
        private RequestMappingHandlerMapping mapping;

        @Autowired
        @Qualifier("mvcConversionService")
        private ConversionService conversion;

        // ---- control endpoints ----

        @RequestMapping(value = "/_record", method = RequestMethod.GET)
        public void record(HttpServletResponse response) throws IOException {
            StringBuilder out = new StringBuilder("[");
            synchronized (records) {
                for (int i = 0; i < records.size(); i++) {
                    if (i > 0) {
                        out.append(',');
                    }
                    Json.object(out, records.get(i));
                }
            }
            out.append(']');
            Json.send(response, out.toString());
        }

        @RequestMapping(value = "/_reset", method = RequestMethod.POST)
        public void reset(HttpServletResponse response) throws IOException {
            synchronized (records) {
                records.clear();
            }
            Json.send(response, "{\"reset\":true}");
        }

        // ---- table A ----

        @RequestMapping("/invoices/{id}")
        public void invoice(@PathVariable("id") String id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            handle(request, response, "invoice:" + id);
        }

        @RequestMapping("/accounts")
        public void accounts(@RequestParam(value = "id", required = false) String id,
                HttpServletRequest request, HttpServletResponse response) throws IOException {
            handle(request, response, "acct:" + (id == null ? "" : id));
        }

        @RequestMapping("/docs/{id}")
        public void doc(@PathVariable("id") String id,
                @RequestHeader(value = "X-Tenant", required = false) String tenant,
                HttpServletRequest request, HttpServletResponse response) throws IOException {
            handle(request, response, "doc:" + (tenant == null ? "" : tenant) + ":" + id);
        }

        // ---- table B: Spring's own conversion ----

        @RequestMapping("/orders/{id}")
        public void order(@PathVariable("id") Long id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            typed(request, response, "order", id);
        }

        @RequestMapping("/parcels/{id}")
        public void parcel(@PathVariable("id") Long id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            typed(request, response, "parcel", id);
        }

        @RequestMapping("/tickets/{id}")
        public void ticket(@PathVariable("id") UUID id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            typed(request, response, "ticket", id);
        }

        @RequestMapping("/badges/{id}")
        public void badge(@PathVariable("id") UUID id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            typed(request, response, "badge", id);
        }

        @RequestMapping("/ledgers")
        public void ledger(@RequestParam("id") Long id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            typed(request, response, "ledger", id);
        }

        @RequestMapping("/tallies")
        public void tally(@RequestParam("id") UUID id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            typed(request, response, "tally", id);
        }

        @RequestMapping("/shipments")
        public void shipment(@RequestHeader("X-Shipment") Long id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            typed(request, response, "shipment", id);
        }

        @RequestMapping("/crates")
        public void crate(@RequestHeader("X-Crate") UUID id, HttpServletRequest request,
                HttpServletResponse response) throws IOException {
            typed(request, response, "crate", id);
        }

        // ---- anything else ----

        @RequestMapping("/**")
        public void other(HttpServletRequest request, HttpServletResponse response) throws IOException {
            handle(request, response, "other:" + lookupPath(request));
        }

        // ---- the record ----

        private void typed(HttpServletRequest request, HttpServletResponse response, String kind,
                Object id) throws IOException {
            if (id == null) {
                // Spring 4.3 turns an empty value into null instead of failing the conversion.
                // (The header tells this 400 from Spring's own ones, which carry none.)
                response.setHeader("X-App-Rejected", "empty id");
                response.sendError(400);
                return;
            }
            handle(request, response, kind + ":" + id);
        }

        private void handle(HttpServletRequest request, HttpServletResponse response, String resource)
                throws IOException {
            String method = request.getMethod();
            if (READS.contains(method)) {
                Json.send(response, "{\"read\":" + Json.quote(resource) + "}");
                return;
            }
            Map<String, String> record = new LinkedHashMap<>();
            record.put("method", method);
            record.put("path", lookupPath(request));
            record.put("resource", resource);
            record.put("fence", request.getHeader("X-Fence"));
            record.put("body", body(request));
            String destination = request.getHeader("Destination");
            String upper = method.toUpperCase(Locale.ROOT);
            if ((upper.equals("MOVE") || upper.equals("COPY")) && destination != null) {
                String target = destinationResource(request, destination);
                if (target == null) {
                    response.setHeader("X-App-Rejected", "destination id");
                    response.sendError(400);
                    return;
                }
                record.put("source_resource", resource);
                record.put("resource", target);
                resource = target;
            }
            synchronized (records) {
                records.add(record);
            }
            Json.send(response, "{\"applied\":" + Json.quote(resource) + "}");
        }

        private String lookupPath(HttpServletRequest request) {
            return mapping.getUrlPathHelper().getLookupPathForRequest(request);
        }

        private static String body(HttpServletRequest request) throws IOException {
            ByteArrayOutputStream bytes = new ByteArrayOutputStream();
            InputStream in = request.getInputStream();
            byte[] buffer = new byte[8192];
            int n;
            while ((n = in.read(buffer)) > 0) {
                bytes.write(buffer, 0, n);
            }
            return new String(bytes.toByteArray(), StandardCharsets.UTF_8);
        }

        // ---- Destination, through Spring's own handler mapping ----

        /**
         * The destination's resource, or null (answered 400) when Jetty would refuse its path or
         * Spring's conversion rejects its id.
         */
        private String destinationResource(HttpServletRequest request, String destination) {
            HttpURI uri = new HttpURI();
            try {
                // As Jetty reads a request line: a path ("//a/b" included) or an absolute URI.
                if (destination.startsWith("/")) {
                    uri.parseRequestTarget("PUT", destination);
                } else {
                    uri.parse(destination);
                }
            } catch (RuntimeException e) {
                return "other:" + destination;
            }
            if (uri.hasViolations()) {
                // Jetty answers 400 to a request whose path its HTTP compliance mode (the
                // connection's; RFC7230 by default) calls ambiguous, e.g. "/x/..;/y".
                HttpConnection connection = HttpConnection.getCurrentConnection();
                HttpCompliance compliance =
                        connection == null ? HttpCompliance.RFC7230 : connection.getHttpCompliance();
                if (HttpCompliance.checkUriCompliance(compliance, uri) != null) {
                    return null;
                }
            }
            String raw = uri.getPath();
            if (raw == null || !raw.startsWith("/")) {
                return "other:" + (raw == null ? "" : raw);
            }
            String decoded;
            try {
                decoded = raw.length() == 1 ? "/" : uri.getDecodedPath();
            } catch (RuntimeException e) {
                return "other:" + raw;
            }
            if (decoded == null || decoded.isEmpty()) {
                return "other:" + raw;
            }
            DestinationRequest probe = new DestinationRequest(request, raw, decoded, uri.getQuery());
            HandlerExecutionChain chain;
            try {
                chain = mapping.getHandler(probe);
            } catch (Exception e) {
                chain = null;
            }
            if (chain == null || !(chain.getHandler() instanceof HandlerMethod)) {
                return "other:" + lookupPath(probe);
            }
            String name = ((HandlerMethod) chain.getHandler()).getMethod().getName();
            @SuppressWarnings("unchecked")
            Map<String, String> vars =
                    (Map<String, String>) probe.getAttribute(HandlerMapping.URI_TEMPLATE_VARIABLES_ATTRIBUTE);
            String pathId = vars == null ? null : vars.get("id");
            switch (name) {
                case "invoice":
                    return "invoice:" + pathId;
                case "accounts": {
                    Object id = multi(probe.getParameterValues("id"));
                    return "acct:" + (id == null ? "" : convert(id, String.class));
                }
                case "doc": {
                    Object tenant = multi(valuesOf(request.getHeaders("X-Tenant")));
                    return "doc:" + (tenant == null ? "" : convert(tenant, String.class)) + ":" + pathId;
                }
                case "order":
                    return typedResource("order", pathId, Long.class);
                case "parcel":
                    return typedResource("parcel", pathId, Long.class);
                case "ticket":
                    return typedResource("ticket", pathId, UUID.class);
                case "badge":
                    return typedResource("badge", pathId, UUID.class);
                case "ledger":
                    return typedResource("ledger", multi(probe.getParameterValues("id")), Long.class);
                case "tally":
                    return typedResource("tally", multi(probe.getParameterValues("id")), UUID.class);
                case "shipment":
                    return typedResource("shipment", multi(valuesOf(request.getHeaders("X-Shipment"))), Long.class);
                case "crate":
                    return typedResource("crate", multi(valuesOf(request.getHeaders("X-Crate"))), UUID.class);
                default:
                    return "other:" + lookupPath(probe);
            }
        }

        /** As Spring's argument resolvers hand a value over: one String, or a String[] for several. */
        private static Object multi(String[] values) {
            if (values == null || values.length == 0) {
                return null;
            }
            return values.length == 1 ? values[0] : values;
        }

        private static String[] valuesOf(Enumeration<String> values) {
            if (values == null || !values.hasMoreElements()) {
                return null;
            }
            return Collections.list(values).toArray(new String[0]);
        }

        private <T> T convert(Object value, Class<T> type) {
            return conversion.convert(value, type);
        }

        private String typedResource(String kind, Object value, Class<?> type) {
            if (value == null) {
                return null;
            }
            Object id;
            try {
                id = conversion.convert(value, type);
            } catch (ConversionException e) {
                return null;
            }
            return id == null ? null : kind + ":" + id;
        }
    }

    /**
     * A request for the Destination path, as Jetty would present one to the DispatcherServlet
     * mapped at "/": the raw path as request URI, Jetty's decoded path as servlet path, its own
     * query parameters and attributes; headers (and character encoding) are the real request's.
     */
    static final class DestinationRequest extends HttpServletRequestWrapper {
        private final String rawPath;
        private final String decodedPath;
        private final String query;
        private final MultiMap<String> parameters = new MultiMap<>();
        private final Map<String, Object> attributes = new HashMap<>();

        DestinationRequest(HttpServletRequest request, String rawPath, String decodedPath, String query) {
            super(request);
            this.rawPath = rawPath;
            this.decodedPath = decodedPath;
            this.query = query;
            if (query != null) {
                UrlEncoded.decodeUtf8To(query, parameters);
            }
        }

        @Override public String getMethod() { return "PUT"; }
        @Override public String getRequestURI() { return rawPath; }
        @Override public StringBuffer getRequestURL() {
            StringBuffer url = new StringBuffer();
            url.append(getScheme()).append("://").append(getServerName()).append(':')
                    .append(getServerPort()).append(rawPath);
            return url;
        }
        @Override public String getContextPath() { return ""; }
        @Override public String getServletPath() { return decodedPath; }
        @Override public String getPathInfo() { return null; }
        @Override public String getPathTranslated() { return null; }
        @Override public String getQueryString() { return query; }
        @Override public DispatcherType getDispatcherType() { return DispatcherType.REQUEST; }

        @Override public String getParameter(String name) { return parameters.getValue(name, 0); }
        @Override public String[] getParameterValues(String name) {
            List<String> values = parameters.getValues(name);
            return values == null ? null : values.toArray(new String[0]);
        }
        @Override public Enumeration<String> getParameterNames() {
            return Collections.enumeration(parameters.keySet());
        }
        @Override public Map<String, String[]> getParameterMap() { return parameters.toStringArrayMap(); }

        @Override public Object getAttribute(String name) { return attributes.get(name); }
        @Override public void setAttribute(String name, Object value) {
            if (value == null) {
                attributes.remove(name);
            } else {
                attributes.put(name, value);
            }
        }
        @Override public void removeAttribute(String name) { attributes.remove(name); }
        @Override public Enumeration<String> getAttributeNames() {
            return Collections.enumeration(attributes.keySet());
        }
    }

    /** Just enough JSON: objects of string (or null) values, written by hand. */
    static final class Json {
        static void send(HttpServletResponse response, String json) throws IOException {
            byte[] bytes = json.getBytes(StandardCharsets.UTF_8);
            response.setStatus(200);
            response.setContentType("application/json");
            response.setCharacterEncoding("UTF-8");
            response.setContentLength(bytes.length);
            response.getOutputStream().write(bytes);
        }

        static void object(StringBuilder out, Map<String, String> fields) {
            out.append('{');
            boolean first = true;
            for (Map.Entry<String, String> field : fields.entrySet()) {
                if (!first) {
                    out.append(',');
                }
                first = false;
                out.append(quote(field.getKey())).append(':');
                out.append(field.getValue() == null ? "null" : quote(field.getValue()));
            }
            out.append('}');
        }

        static String quote(String s) {
            StringBuilder out = new StringBuilder(s.length() + 2).append('"');
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                switch (c) {
                    case '"': out.append("\\\""); break;
                    case '\\': out.append("\\\\"); break;
                    case '\n': out.append("\\n"); break;
                    case '\r': out.append("\\r"); break;
                    case '\t': out.append("\\t"); break;
                    default:
                        if (c < 0x20 || c == 0x2028 || c == 0x2029) {
                            out.append(String.format("\\u%04x", (int) c));
                        } else {
                            out.append(c);
                        }
                }
            }
            return out.append('"').toString();
        }
    }
}
