<?php
/*
 * jobmgr's runner for BedrockWorkerManager (BWM) PHP workers
 * ==========================================================
 * It runs one job with one BWM worker class, unchanged, as BWM's forked
 * child does: `new ClassName($bedrock, $job)`, then `run()`, then the
 * worker's `getData()` for the job. jobmgr embeds this file and prints it
 * with `jobmgr bwm-php-runner`; the supervisor (worker-kind "bwm-php") runs
 *
 *     php -d display_errors=stderr -d log_errors=0 RUNNER CLASS_FILE CLASS_NAME
 *
 * in the job's scratch directory, CLASS_FILE being WORKERPATH/CLASS_NAME.php.
 *
 * Input
 *   stdin   the job as one JSON object (jobID, name, data, …), then EOF.
 *   env     JOBMGR_PHP_BOOTSTRAP   a PHP file required first (autoloader, config)
 *           JOBMGR_BEDROCK_HOST/_PORT  the job server's Bedrock port
 *           JOBMGR_JOB_TOKEN       sent as `Token:` on every Bedrock request
 *           JOBMGR_PROGRESS_FD     the report fd (3); JOBMGR_JOB_ID, _JOB_NAME, _ATTEMPT
 *   The job name's `?extra` part is cut off before the worker sees it, as BWM does.
 *
 * The worker's $bedrock: when the bootstrap makes Expensify\Bedrock\Client
 * available, that client, configured for the address above, and made to send
 * the token (also for code that calls Client::getInstance() itself, such as
 * Jobs::queueJob); otherwise a small client of this file's own with the same
 * call()/getLogger()/getStats() shape.
 *
 * Outcomes
 *   success            (run() returned, or data has mockRequest: run() skipped)
 *                      on fd 3 {"jobmgr.report":{"outcome":"finish","data":getData()}}
 *                      exit 0 (jobmgr finishes the job whatever exit code
 *                      PHP's shutdown ends with after this line)
 *   RetryableException on fd 3
 *                      {"jobmgr.report":{"outcome":"retry","delay":N,"nextRun":…,"name":…,"ignoreRepeat":B,"data":getData()}}
 *                      exit 75
 *   any other Throwable the exception and trace on stderr; on fd 3
 *                      {"jobmgr.report":{"outcome":"fail","reason":"Class: message"}}
 *                      exit 1
 *   cannot start       (bad job JSON, bootstrap or class file that does not load,
 *                      no such class, constructor throwing) one line on stderr,
 *                      no report line, exit 1: jobmgr's retry policy applies
 *   exit() or a fatal  the process's own exit code (a fatal error is 255); the
 *                      runner says on stderr what happened, no report line
 * The data travels in the report line (up to 1 MiB), never on stdout, which
 * is the worker's own output. Without fd 3 the report goes to stderr and the
 * exit code is the same.
 */

// Everything of the runner's own is prefixed jobmgr/Jobmgr, and its main flow
// runs at the top level, so the bootstrap and the class file are included in
// the global scope as BWM includes them.

/** What the runner has reached; the shutdown function reads it. */
$GLOBALS['jobmgr_state'] = ['phase' => 'reading the job', 'outcome' => null, 'class' => null, 'file' => null];
/** Memory freed when a fatal error (such as memory exhausted) ends the script. */
$GLOBALS['jobmgr_reserve'] = str_repeat('x', 256 * 1024);

function jobmgr_say(string $message): void
{
    fwrite(STDERR, "jobmgr bwm-php: $message\n");
}

/** Ends the runner without an outcome: jobmgr's own retry policy applies. */
function jobmgr_cannot_start(string $message): void
{
    $GLOBALS['jobmgr_state']['outcome'] = 'cannot start';
    jobmgr_say($message);
    exit(1);
}

function jobmgr_shutdown(): void
{
    $GLOBALS['jobmgr_reserve'] = null;
    $state = $GLOBALS['jobmgr_state'];
    if ($state['outcome'] !== null) {
        return;
    }
    $error = error_get_last();
    $fatal = E_ERROR | E_PARSE | E_CORE_ERROR | E_COMPILE_ERROR | E_USER_ERROR | E_RECOVERABLE_ERROR;
    if ($error !== null && ($error['type'] & $fatal)) {
        jobmgr_say("PHP fatal error while {$state['phase']}: {$error['message']} in {$error['file']}:{$error['line']}; "
            .'the job ends by exit code 255, without a report, and jobmgr\'s retry policy applies');

        return;
    }
    if ($state['phase'] === 'running the worker') {
        jobmgr_say('the worker called exit() before run() returned; the job ends by that exit code '
            .'(0 finishes it with its data unchanged)');
    } else {
        jobmgr_say("the script ended by exit() while {$state['phase']}, before the worker ran; "
            .'the job ends by that exit code (0 finishes it with its data unchanged)');
    }
}
register_shutdown_function('jobmgr_shutdown');

/** The report fd, opened before any site code runs; null when there is none. */
function jobmgr_open_report_fd()
{
    $number = getenv('JOBMGR_PROGRESS_FD');
    $number = ($number !== false && ctype_digit($number)) ? (int) $number : 3;
    $handle = @fopen("php://fd/$number", 'w');
    if ($handle === false) {
        return null;
    }
    // Without an inherited fd 3, PHP itself holds the runner's source open
    // there: that is not the report fd.
    $stat = @fstat($handle);
    $self = @stat(__FILE__);
    if ($stat === false || ($self !== false && $stat['dev'] === $self['dev'] && $stat['ino'] === $self['ino'])) {
        fclose($handle);

        return null;
    }

    return $handle;
}

function jobmgr_json($value): string
{
    return json_encode($value, JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE | JSON_PRESERVE_ZERO_FRACTION
        | JSON_INVALID_UTF8_SUBSTITUTE | JSON_THROW_ON_ERROR);
}

/**
 * Writes the outcome's report line to the report fd, or to stderr without
 * one; $data_json (the worker's data, one JSON object) goes in as its data.
 */
function jobmgr_report(array $report, ?string $data_json = null): void
{
    $inner = jobmgr_json($report);
    if ($data_json !== null) {
        $inner = substr($inner, 0, -1).',"data":'.$data_json.'}';
    }
    $line = '{"jobmgr.report":'.$inner."}\n";
    $handle = $GLOBALS['jobmgr_report_fd'];
    if ($handle !== null && @fwrite($handle, $line) === strlen($line)) {
        @fflush($handle);

        return;
    }
    jobmgr_say('no report fd (fd 3) to write to; the report would have been: '.rtrim($line));
}

/**
 * The worker's getData() as one JSON object, or null when it gives none
 * (the job's data then stays as it was). Throws what getData() throws.
 */
function jobmgr_data_line($worker): ?string
{
    if (!is_callable([$worker, 'getData'])) {
        return null;
    }
    $data = $worker->getData();
    if ($data === null) {
        return null;
    }
    if (is_array($data) && $data === []) {
        return '{}';
    }
    if (!is_array($data) && !is_object($data)) {
        jobmgr_say('getData() returned '.gettype($data).', not an array: the job\'s data is left as it was');

        return null;
    }
    try {
        $json = jobmgr_json($data);
    } catch (\JsonException $e) {
        jobmgr_say('getData() cannot be written as JSON ('.$e->getMessage().'): the job\'s data is left as it was');

        return null;
    }
    if ($json === '[]') {
        return '{}';
    }
    if ($json === '' || $json[0] !== '{') {
        jobmgr_say('getData() is a list, not an object with keys: the job\'s data is left as it was');

        return null;
    }

    return $json;
}

/** Flushes what the worker left in PHP's output buffers to stdout. */
function jobmgr_flush_output(): void
{
    while (ob_get_level() > 0 && @ob_end_flush()) {
    }
    fflush(STDOUT);
}

function jobmgr_cut(string $text, int $chars): string
{
    if (function_exists('mb_strlen') && function_exists('mb_substr')) {
        return mb_strlen($text, 'UTF-8') > $chars ? mb_substr($text, 0, $chars - 1, 'UTF-8').'…' : $text;
    }

    return strlen($text) > $chars ? substr($text, 0, $chars - 3).'...' : $text;
}

function jobmgr_describe(\Throwable $e): string
{
    $text = '';
    for ($current = $e, $depth = 0; $current !== null && $depth < 10; $current = $current->getPrevious(), $depth++) {
        $text .= ($depth ? "\nCaused by: " : '').get_class($current).': '.$current->getMessage()
            .' in '.$current->getFile().':'.$current->getLine()."\n".$current->getTraceAsString();
    }

    return $text;
}

/** Whether $e is Bedrock-PHP's RetryableException (or, without Bedrock-PHP, one like it). */
function jobmgr_is_retryable(\Throwable $e): bool
{
    $class = 'Expensify\\Bedrock\\Exceptions\\Jobs\\RetryableException';
    if (class_exists($class, false)) {
        return $e instanceof $class;
    }
    $name = get_class($e);
    $short = substr($name, (int) strrpos('\\'.$name, '\\'));

    return $short === 'RetryableException' && method_exists($e, 'getDelay');
}

/** A PSR-3-shaped logger writing `[level] message {context}` lines to stderr. */
class JobmgrBedrockLogger
{
    public function emergency($message, array $context = []) { $this->log('emergency', $message, $context); }
    public function alert($message, array $context = []) { $this->log('alert', $message, $context); }
    public function critical($message, array $context = []) { $this->log('critical', $message, $context); }
    public function error($message, array $context = []) { $this->log('error', $message, $context); }
    public function warning($message, array $context = []) { $this->log('warning', $message, $context); }
    public function notice($message, array $context = []) { $this->log('notice', $message, $context); }
    public function info($message, array $context = []) { $this->log('info', $message, $context); }
    public function debug($message, array $context = []) { $this->log('debug', $message, $context); }

    public function log($level, $message, array $context = [])
    {
        $message = (string) $message;
        $replace = [];
        foreach ($context as $key => $value) {
            if (is_scalar($value) || (is_object($value) && method_exists($value, '__toString'))) {
                $replace['{'.$key.'}'] = (string) $value;
            }
        }
        $message = strtr($message, $replace);
        array_walk_recursive($context, function (&$value) {
            if ($value instanceof \Throwable) {
                $value = get_class($value).': '.$value->getMessage().' at '.$value->getFile().':'.$value->getLine();
            }
        });
        try {
            $json = $context ? ' '.jobmgr_json($context) : '';
        } catch (\Throwable $e) {
            $json = ' {context not writable as JSON}';
        }
        fwrite(STDERR, '['.$level.'] '.$message.$json."\n");
    }
}

/** Stats that are not kept: benchmark() runs the function, anything else does nothing. */
class JobmgrBedrockStats
{
    public function benchmark($name, callable $function)
    {
        return $function();
    }

    public function __call($name, $arguments)
    {
        return null;
    }
}

/**
 * jobmgr's own Bedrock client, for sites whose bootstrap does not provide
 * Expensify\Bedrock\Client: Bedrock's text protocol, one connection a call.
 */
class JobmgrBedrockClient
{
    /** @var ?int as Bedrock-PHP's client has it; sent as commitCount when set */
    public $commitCount;
    private $host;
    private $port;
    private $token;
    private $logger;
    private $stats;

    public function __construct(?string $host, ?int $port, ?string $token)
    {
        $this->host = $host;
        $this->port = $port;
        $this->token = $token;
        $this->logger = new JobmgrBedrockLogger();
        $this->stats = new JobmgrBedrockStats();
    }

    public function getLogger() { return $this->logger; }
    public function setLogger($logger) { $this->logger = $logger; }
    public function getStats() { return $this->stats; }
    public function getClusterName(): string { return 'jobmgr'; }
    public function getLastHost(): string { return (string) $this->host; }

    /**
     * Sends one command; returns code, codeLine, headers and body (decoded
     * JSON when it is JSON). Throws when there is no server to reach.
     */
    public function call($method, $headers = [], $body = '')
    {
        if ($this->host === null || $this->port === null) {
            throw new \RuntimeException("cannot send $method to Bedrock: no address (JOBMGR_BEDROCK_HOST and JOBMGR_BEDROCK_PORT are unset; start the supervisor with php-bedrock HOST:PORT)");
        }
        $headers = (array) $headers;
        $body = (string) $body;
        if ($this->commitCount) {
            $headers['commitCount'] = $this->commitCount;
        }
        if ($this->token !== null) {
            $headers['Token'] = $this->token;
        }
        $request = "$method\r\n";
        foreach ($headers as $name => $value) {
            if (is_array($value) || is_object($value)) {
                // Backslash-escaped as Bedrock-PHP sends it: the server
                // unescapes every header before it reads the JSON.
                $request .= "$name: ".addcslashes((string) json_encode($value, JSON_PRESERVE_ZERO_FRACTION | JSON_UNESCAPED_SLASHES | JSON_INVALID_UTF8_SUBSTITUTE), '\\')."\r\n";
            } elseif (is_bool($value)) {
                $request .= "$name: ".($value ? 'true' : 'false')."\r\n";
            } elseif ($value === null || $value === '') {
                continue;
            } else {
                $request .= "$name: ".addcslashes((string) $value, "\r\n\t\\")."\r\n";
            }
        }
        $request .= 'Content-Length: '.strlen($body)."\r\n\r\n".$body;

        $host = strpos($this->host, ':') !== false ? "[{$this->host}]" : $this->host;
        $address = "tcp://$host:{$this->port}";
        $socket = @stream_socket_client($address, $errno, $errstr, 10);
        if ($socket === false) {
            throw new \RuntimeException("cannot send $method to Bedrock at $address: $errstr ($errno)");
        }
        try {
            stream_set_timeout($socket, 120);
            for ($sent = 0; $sent < strlen($request); $sent += $n) {
                $n = @fwrite($socket, substr($request, $sent));
                if ($n === false || $n === 0) {
                    throw new \RuntimeException("sending $method to Bedrock at $address failed");
                }
            }
            $codeLine = $this->readLine($socket, $method);
            $responseHeaders = [];
            while (($line = $this->readLine($socket, $method)) !== '') {
                $parts = explode(':', $line, 2);
                if (count($parts) === 2) {
                    $responseHeaders[trim($parts[0])] = trim($parts[1]);
                }
            }
            $length = 0;
            foreach ($responseHeaders as $name => $value) {
                if (strcasecmp($name, 'Content-Length') === 0) {
                    $length = (int) $value;
                }
            }
            $raw = '';
            while (strlen($raw) < $length) {
                $chunk = fread($socket, $length - strlen($raw));
                if ($chunk === false || $chunk === '') {
                    throw new \RuntimeException("Bedrock at $address closed the connection in the answer to $method");
                }
                $raw .= $chunk;
            }
        } finally {
            fclose($socket);
        }
        $this->logger->debug("Bedrock $method: $codeLine");
        $contentType = null;
        foreach ($responseHeaders as $name => $value) {
            if (strcasecmp($name, 'Content-Type') === 0) {
                $contentType = $value;
            }
        }
        $decoded = $raw;
        if ($contentType === null || strcasecmp($contentType, 'application/json') === 0) {
            $trimmed = trim($raw);
            if ($trimmed === '') {
                $decoded = [];
            } else {
                $json = json_decode($trimmed, true);
                if (json_last_error() === JSON_ERROR_NONE) {
                    $decoded = $json;
                }
            }
        }

        return [
            'headers' => $responseHeaders,
            'body' => $decoded,
            'rawBody' => $raw,
            'size' => strlen($raw),
            'codeLine' => $codeLine,
            'code' => intval($codeLine),
        ];
    }

    private function readLine($socket, string $method): string
    {
        $line = fgets($socket);
        if ($line === false) {
            $meta = stream_get_meta_data($socket);
            $why = !empty($meta['timed_out']) ? 'did not answer in time' : 'closed the connection';
            throw new \RuntimeException("Bedrock $why before answering $method");
        }

        return rtrim($line, "\r\n");
    }
}

/**
 * Bedrock-PHP's Client, configured for jobmgr's Bedrock port, sending the job
 * token on every request, and installed as the default instance so that
 * Client::getInstance() returns it too. Throws when that cannot be done.
 */
function jobmgr_bedrock_php_client(?string $host, ?int $port, ?string $token)
{
    $client = 'Expensify\\Bedrock\\Client';
    if ($host !== null && $port !== null) {
        $hosts = [$host => ['blacklistedUntil' => 0, 'port' => $port]];
        $client::configure(['mainHostConfigs' => $hosts, 'failoverHostConfigs' => $hosts]);
    } else {
        $configured = true;
        try {
            $configured = \Closure::bind(static function () {
                return self::$defaultConfig !== [];
            }, null, $client)();
        } catch (\Throwable $e) {
            // Another version of Client: let getInstance() say.
        }
        if (!$configured) {
            throw new \RuntimeException('it has no host: JOBMGR_BEDROCK_HOST is unset and the bootstrap did not call Client::configure()');
        }
    }
    $plain = $client::getInstance();
    if ($token === null) {
        return $plain;
    }
    try {
        return jobmgr_token_client($client, $plain, $token);
    } catch (\Throwable $e) {
        jobmgr_say('Bedrock requests will not carry the job token, and the server refuses them: '.$e->getMessage());

        return $plain;
    }
}

/** $plain's twin that sends the token, installed in its place in Client's instances. */
function jobmgr_token_client(string $client, $plain, string $token)
{
    $reflection = new \ReflectionClass($client);
    if ($reflection->isFinal()) {
        throw new \RuntimeException("$client is final");
    }
    $call = $reflection->getMethod('call');
    if ($call->isFinal() || $call->isStatic() || !$call->isPublic() || $call->hasReturnType() || $call->getNumberOfParameters() > 3) {
        throw new \RuntimeException("$client::call() has a signature this runner cannot override");
    }
    foreach ($call->getParameters() as $parameter) {
        if ($parameter->isPassedByReference() || $parameter->isVariadic()) {
            throw new \RuntimeException("$client::call() has a signature this runner cannot override");
        }
    }
    if (!class_exists('JobmgrTokenClient', false)) {
        // Declared only here, once Client is known and overridable.
        class JobmgrTokenClient extends \Expensify\Bedrock\Client
        {
            private static $jobmgrToken;

            public static function jobmgrSetToken(string $token): void
            {
                self::$jobmgrToken = $token;
            }

            public function call($method, $headers = [], $body = '', ...$more)
            {
                $headers = (array) $headers;
                $headers['Token'] = self::$jobmgrToken;

                return parent::call($method, $headers, $body, ...$more);
            }
        }
    }
    \JobmgrTokenClient::jobmgrSetToken($token);
    $withToken = (new \ReflectionClass('JobmgrTokenClient'))->newInstanceWithoutConstructor();
    // Client's constructor is private: run it in Client's scope. getInstance()
    // built $plain from the default config merged in the same way.
    \Closure::bind(function () {
        $this->__construct([]);
    }, $withToken, $client)();
    $withToken->commitCount = $plain->commitCount;
    $installed = \Closure::bind(function () use ($plain, $withToken) {
        foreach (self::$instances as $key => $instance) {
            if ($instance === $plain) {
                self::$instances[$key] = $withToken;

                return true;
            }
        }

        return false;
    }, null, $client)();
    if (!$installed || $client::getInstance() !== $withToken) {
        throw new \RuntimeException('Client::getInstance() does not keep its instances as this runner expects');
    }

    return $withToken;
}

// ---------------------------------------------------------------------------
// The job.

$jobmgr_report_fd = jobmgr_open_report_fd();
$jobmgr_class_file = $argv[1] ?? '';
$jobmgr_class = $argv[2] ?? '';
$GLOBALS['jobmgr_state']['class'] = $jobmgr_class;
$GLOBALS['jobmgr_state']['file'] = $jobmgr_class_file;
if ($jobmgr_class_file === '' || $jobmgr_class === '' || count($argv) !== 3) {
    jobmgr_cannot_start('usage: php runner.php CLASS_FILE CLASS_NAME, with the job as JSON on stdin');
}

$jobmgr_input = stream_get_contents(STDIN);
$job = json_decode((string) $jobmgr_input, true);
if (json_last_error() !== JSON_ERROR_NONE || !is_array($job) || ($job !== [] && array_keys($job) === range(0, count($job) - 1))) {
    jobmgr_cannot_start('the job on stdin is not a JSON object ('
        .(json_last_error() !== JSON_ERROR_NONE ? json_last_error_msg() : gettype($job)).'): this runner is started by jobmgr, which writes the job there');
}
unset($jobmgr_input);
if (!isset($job['data']) || !is_array($job['data'])) {
    $job['data'] = [];
}
// jobmgr's own record of the last run (`_jobmgr`: outcome, output tails) is
// not the worker's data, and BWM's workers never had it: a worker whose
// getData() returns its data whole would hand it back, nested once more at
// every retry.
unset($job['data']['_jobmgr']);
// BWM cuts `?extra` off the name and only logs it.
$jobmgr_name_parts = explode('?', (string) ($job['name'] ?? ''), 2);
$job['name'] = $jobmgr_name_parts[0];
$jobmgr_extra = $jobmgr_name_parts[1] ?? null;
$jobmgr_job_label = 'job '.($job['jobID'] ?? getenv('JOBMGR_JOB_ID') ?: '?')." ({$job['name']})";
if ($jobmgr_extra !== null) {
    jobmgr_say("$jobmgr_job_label: extra params in the job name, not passed to the worker (as BWM): $jobmgr_extra");
}
unset($jobmgr_name_parts);

// The site's bootstrap, in the global scope.
$GLOBALS['jobmgr_state']['phase'] = 'loading the bootstrap';
$jobmgr_bootstrap = getenv('JOBMGR_PHP_BOOTSTRAP');
if ($jobmgr_bootstrap !== false && $jobmgr_bootstrap !== '') {
    if (!is_file($jobmgr_bootstrap) || !is_readable($jobmgr_bootstrap)) {
        jobmgr_cannot_start("the bootstrap $jobmgr_bootstrap cannot be read: check php-bootstrap and that worker users may read it");
    }
    try {
        require_once $jobmgr_bootstrap;
    } catch (\Throwable $jobmgr_e) {
        jobmgr_cannot_start("the bootstrap $jobmgr_bootstrap failed: ".get_class($jobmgr_e).': '.$jobmgr_e->getMessage()
            .' at '.$jobmgr_e->getFile().':'.$jobmgr_e->getLine().'; fix it (or finish the deploy); jobmgr retries the job by its policy');
    }
}

// The worker's Bedrock client.
$GLOBALS['jobmgr_state']['phase'] = 'making the Bedrock client';
$jobmgr_host = getenv('JOBMGR_BEDROCK_HOST') ?: null;
$jobmgr_port = ctype_digit((string) getenv('JOBMGR_BEDROCK_PORT')) ? (int) getenv('JOBMGR_BEDROCK_PORT') : null;
$jobmgr_token = getenv('JOBMGR_JOB_TOKEN') ?: null;
$bedrock = null;
$jobmgr_has_client = false;
try {
    $jobmgr_has_client = class_exists('Expensify\\Bedrock\\Client');
} catch (\Throwable $jobmgr_e) {
    jobmgr_say('autoloading Expensify\\Bedrock\\Client failed ('.$jobmgr_e->getMessage().'): using jobmgr\'s own Bedrock client');
}
if ($jobmgr_has_client) {
    try {
        $bedrock = jobmgr_bedrock_php_client($jobmgr_host, $jobmgr_port, $jobmgr_token);
    } catch (\Throwable $jobmgr_e) {
        jobmgr_say('Expensify\\Bedrock\\Client cannot be made ('.$jobmgr_e->getMessage().'): the worker gets jobmgr\'s own Bedrock client');
    }
}
if ($bedrock === null) {
    $bedrock = new JobmgrBedrockClient($jobmgr_host, $jobmgr_port, $jobmgr_token);
}
unset($jobmgr_e, $jobmgr_has_client);

// The worker class, included in the global scope as BWM includes it.
$GLOBALS['jobmgr_state']['phase'] = "loading the worker class file $jobmgr_class_file";
$jobmgr_declared = get_declared_classes();
try {
    if (!is_file($jobmgr_class_file) || !is_readable($jobmgr_class_file)) {
        jobmgr_cannot_start("the worker class file $jobmgr_class_file cannot be read: check that it exists and worker users may read it");
    }
    if ((include_once $jobmgr_class_file) === false) {
        jobmgr_cannot_start("the worker class file $jobmgr_class_file could not be included");
    }
} catch (\Throwable $jobmgr_e) {
    $jobmgr_what = $jobmgr_e instanceof \ParseError ? 'has a syntax error' : 'failed to load';
    jobmgr_cannot_start("the worker class file $jobmgr_class_file $jobmgr_what: ".get_class($jobmgr_e).': '
        .$jobmgr_e->getMessage().' at '.$jobmgr_e->getFile().':'.$jobmgr_e->getLine()
        .'; fix it (or finish the deploy); jobmgr retries the job by its policy');
}
if (!class_exists($jobmgr_class, false)) {
    $jobmgr_new = array_values(array_diff(get_declared_classes(), $jobmgr_declared));
    jobmgr_cannot_start("the worker class file $jobmgr_class_file declares no class $jobmgr_class (it declares "
        .($jobmgr_new ? implode(', ', $jobmgr_new) : 'no new class')
        ."): BWM runs the class named after the file, in the global namespace; rename the class or the file");
}
unset($jobmgr_declared, $jobmgr_new);

$GLOBALS['jobmgr_state']['phase'] = "constructing $jobmgr_class";
try {
    $jobmgr_worker = new $jobmgr_class($bedrock, $job);
} catch (\Throwable $jobmgr_e) {
    jobmgr_cannot_start("new $jobmgr_class(\$bedrock, \$job) from $jobmgr_class_file threw ".get_class($jobmgr_e).': '
        .$jobmgr_e->getMessage().' at '.$jobmgr_e->getFile().':'.$jobmgr_e->getLine()
        .'; a worker class is built with the Bedrock client and the job (BWM\'s BedrockWorker constructor)');
}
if (!is_callable([$jobmgr_worker, 'run'])) {
    jobmgr_cannot_start("$jobmgr_class in $jobmgr_class_file has no public run() method: a BWM worker extends BedrockWorker and implements run()");
}

// Run it, as BWM's child does.
$GLOBALS['jobmgr_state']['phase'] = 'running the worker';
try {
    if (is_callable([$jobmgr_worker, 'getParam']) && $jobmgr_worker->getParam('mockRequest')) {
        jobmgr_say("$jobmgr_job_label: mock job, not running and marking as finished (as BWM)");
    } else {
        $jobmgr_worker->run();
    }
    $GLOBALS['jobmgr_state']['phase'] = 'reading the worker\'s data';
    $jobmgr_line = jobmgr_data_line($jobmgr_worker);
    $GLOBALS['jobmgr_state']['outcome'] = 'success';
    // Reported before the process ends: what PHP does at shutdown (a
    // shutdown function that throws, a destructor's exit()) does not undo it.
    jobmgr_report(['outcome' => 'finish'], $jobmgr_line);
    jobmgr_flush_output();
    exit(0);
} catch (\Throwable $jobmgr_e) {
    if (jobmgr_is_retryable($jobmgr_e) && $GLOBALS['jobmgr_state']['phase'] === 'running the worker') {
        $GLOBALS['jobmgr_state']['phase'] = 'reading the worker\'s data';
        try {
            $jobmgr_line = jobmgr_data_line($jobmgr_worker);
            $jobmgr_retry = ['outcome' => 'retry', 'delay' => 0];
            $jobmgr_delay = (int) $jobmgr_e->getDelay();
            if ($jobmgr_delay < 0) {
                jobmgr_say("the RetryableException's delay $jobmgr_delay is negative: 0 is used");
                $jobmgr_delay = 0;
            }
            $jobmgr_retry['delay'] = $jobmgr_delay;
            $jobmgr_next_run = method_exists($jobmgr_e, 'getNextRun') ? (string) $jobmgr_e->getNextRun() : '';
            if ($jobmgr_next_run !== '') {
                $jobmgr_retry['nextRun'] = $jobmgr_next_run;
            }
            $jobmgr_new_name = method_exists($jobmgr_e, 'getName') ? (string) $jobmgr_e->getName() : '';
            if ($jobmgr_new_name !== '') {
                $jobmgr_retry['name'] = $jobmgr_new_name;
            }
            $jobmgr_retry['ignoreRepeat'] = method_exists($jobmgr_e, 'getIgnoreRepeat') && (bool) $jobmgr_e->getIgnoreRepeat();
        } catch (\Throwable $jobmgr_e2) {
            $jobmgr_e = $jobmgr_e2;
            $jobmgr_retry = null;
        }
        if ($jobmgr_retry !== null) {
            $GLOBALS['jobmgr_state']['outcome'] = 'retry';
            jobmgr_say("$jobmgr_job_label: job could not complete, retrying: ".get_class($jobmgr_e).': '.$jobmgr_e->getMessage()
                ." (delay {$jobmgr_retry['delay']}s"
                .(isset($jobmgr_retry['nextRun']) ? ", nextRun {$jobmgr_retry['nextRun']}" : '')
                .(isset($jobmgr_retry['name']) ? ", new name {$jobmgr_retry['name']}" : '')
                .($jobmgr_retry['ignoreRepeat'] ? ', ignoring repeat' : '').')');
            jobmgr_report($jobmgr_retry, $jobmgr_line);
            jobmgr_flush_output();
            exit(75);
        }
    }
    $GLOBALS['jobmgr_state']['outcome'] = 'fail';
    $jobmgr_where = $GLOBALS['jobmgr_state']['phase'] === 'running the worker' ? '' : ' (in getData())';
    jobmgr_say("$jobmgr_job_label: job failed with errors$jobmgr_where:\n".jobmgr_describe($jobmgr_e));
    jobmgr_report(['outcome' => 'fail', 'reason' => jobmgr_cut(get_class($jobmgr_e).': '.$jobmgr_e->getMessage(), 500)]);
    jobmgr_flush_output();
    exit(1);
}
