// Prints the id of the KRaft quorum's leader (the active controller) of the cluster at the
// bootstrap servers given as the first argument, using the Admin client from Kafka's own
// jars. Run as a single-file program: java -cp '<libs>/*' scripts/kafka/Quorum.java HOST:PORT
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;

public class Quorum {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "5000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "10000");
        try (Admin admin = Admin.create(props)) {
            int leader = admin.describeMetadataQuorum().quorumInfo().get(15, TimeUnit.SECONDS).leaderId();
            System.out.println(leader);
        }
    }
}
